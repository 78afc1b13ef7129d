// %2 = conv2d(%x, %cv1.W, %cv1.b) {groups=1, pad=(0, 0), stride=(1, 1), epilogue=($result[i0, i1, i2, i3] + %cv1.b[i1])} : f32[64,20,24,24]  # lenet.ddsl:13:13 cv1
extern "C" __global__ void conv2d__cv1__v2(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_conv2d_igemm(out, in0, in1, 64, 1, 28, 28, 20, 5, 5, 24, 24, 1, 1, 0, 0, 1, 1, 1);
}

// epilogue of %2: out[i0, i1, i2, i3] = (out[i0, i1, i2, i3] + in1[i1])
extern "C" __global__ void conv2d__cv1__v2_epilogue(float* out, const float* in0, const float* in1) {
  DD_GRID_STRIDE(e, 737280) {
    int i1 = e / 576 % 20;
    out[e] = (in0[e] + in1[i1]);
  }
}

// %3 = max_pool2d(%2) {kernel=(2, 2), pad=(0, 0), stride=(2, 2)} : f32[64,20,12,12]  # lenet.ddsl:15:13 mp
extern "C" __global__ void max_pool2d__mp__v3(float* __restrict__ out, const float* __restrict__ in0) {
  dd_max_pool2d(out, in0, 1280, 24, 24, 12, 12, 2, 2, 2, 2, 0, 0);
}

// %5 = conv2d(%3, %cv2.W, %cv2.b) {groups=1, pad=(0, 0), stride=(1, 1), epilogue=($result[i0, i1, i2, i3] + %cv2.b[i1])} : f32[64,50,8,8]  # lenet.ddsl:14:13 cv2
extern "C" __global__ void conv2d__cv2__v5(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_conv2d_igemm(out, in0, in1, 64, 20, 12, 12, 50, 5, 5, 8, 8, 1, 1, 0, 0, 1, 1, 1);
}

// epilogue of %5: out[i0, i1, i2, i3] = (out[i0, i1, i2, i3] + in1[i1])
extern "C" __global__ void conv2d__cv2__v5_epilogue(float* out, const float* in0, const float* in1) {
  DD_GRID_STRIDE(e, 204800) {
    int i1 = e / 64 % 50;
    out[e] = (in0[e] + in1[i1]);
  }
}

// %6 = max_pool2d(%5) {kernel=(2, 2), pad=(0, 0), stride=(2, 2)} : f32[64,50,4,4]  # lenet.ddsl:15:13 mp
extern "C" __global__ void max_pool2d__mp__v6(float* __restrict__ out, const float* __restrict__ in0) {
  dd_max_pool2d(out, in0, 3200, 8, 8, 4, 4, 2, 2, 2, 2, 0, 0);
}

// %10 = linear(%7, %fc1.W, %fc1.b) {epilogue=max(($result[i0, i1] + %fc1.b[i1]), 0)} : f32[64,500]  # lenet.ddsl:16:13 fc1
extern "C" __global__ void linear__fc1__v10(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_gemm(out, in0, in1, 64, 500, 800, 0, 1);
}

// epilogue of %10: out[i0, i1] = max((out[i0, i1] + in1[i1]), 0)
extern "C" __global__ void linear__fc1__v10_epilogue(float* out, const float* in0, const float* in1) {
  DD_GRID_STRIDE(e, 32000) {
    int i1 = e % 500;
    out[e] = fmaxf((in0[e] + in1[i1]), 0.0f);
  }
}

// %12 = linear(%10, %fc2.W, %fc2.b) {epilogue=($result[i0, i1] + %fc2.b[i1])} : f32[64,10]  # lenet.ddsl:17:13 fc2
extern "C" __global__ void linear__fc2__v12(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_gemm(out, in0, in1, 64, 10, 500, 0, 1);
}

// epilogue of %12: out[i0, i1] = (out[i0, i1] + in1[i1])
extern "C" __global__ void linear__fc2__v12_epilogue(float* out, const float* in0, const float* in1) {
  DD_GRID_STRIDE(e, 640) {
    int i1 = e % 10;
    out[e] = (in0[e] + in1[i1]);
  }
}

// %13 = softmax_cross_entropy(%12, %y) : f32[]  # lenet.ddsl:21:11
extern "C" __global__ void softmax_cross_entropy__v13(float* __restrict__ out, const float* __restrict__ in0, const long long* __restrict__ in1) {
  dd_softmax_cross_entropy(out, in0, in1, 64, 10);
}

// %15 = softmax_cross_entropy_backward(%12, %y, %const14) : f32[64,10]  # lenet.ddsl:21:11
extern "C" __global__ void softmax_cross_entropy_backward__v15(float* __restrict__ out, const float* __restrict__ in0, const long long* __restrict__ in1, const float* __restrict__ in2) {
  dd_softmax_cross_entropy_backward(out, in0, in1, in2, 64, 10);
}

// %16 = channel_sum(%15) : f32[10]  # lenet.ddsl:17:13 fc2
// a0 = (sum[r0:64] in0[r0, i0])
extern "C" __global__ void channel_sum__fc2__v16(float* out0, const float* in0) {
  const int yo = blockIdx.y;
  const int lo0 = (int) ((long long) yo * 64 / 1), hi0 = (int) ((long long) (yo + 1) * 64 / 1);
  DD_BLOCK_STRIDE(e, 10) {
    const int i0 = e;
    double a0 = 0.0;
    #pragma unroll 4
    for (int r0 = lo0 + threadIdx.x; r0 < hi0; r0 += blockDim.x) {
      a0 += (double) (in0[10 * r0 + i0]);
    }
    a0 = dd_block_sum_double(a0);
    if (threadIdx.x == 0) {
      const float r0 = ((float) a0);
      out0[e] = r0;
    }
  }
}

// %19 = matmul(%15, %fc2.W, %10) {epilogue=((%10[i0, i1] > 0) ? $result[i0, i1] : 0)} : f32[64,500]  # lenet.ddsl:17:13 fc2
extern "C" __global__ void matmul__fc2__v19(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_gemm(out, in0, in1, 64, 500, 10, 0, 0);
}

// epilogue of %19: out[i0, i1] = ((in1[i0, i1] > 0) ? out[i0, i1] : 0)
extern "C" __global__ void matmul__fc2__v19_epilogue(float* out, const float* in0, const float* __restrict__ in1) {
  DD_GRID_STRIDE(q, 8000) {
    const float4 v0 = reinterpret_cast<const float4*>(in0)[q];
    const float4 v1 = reinterpret_cast<const float4*>(in1)[q];
    float4 r;
    r.x = ((v1.x > 0.0f) ? v0.x : 0.0f);
    r.y = ((v1.y > 0.0f) ? v0.y : 0.0f);
    r.z = ((v1.z > 0.0f) ? v0.z : 0.0f);
    r.w = ((v1.w > 0.0f) ? v0.w : 0.0f);
    reinterpret_cast<float4*>(out)[q] = r;
  }
}

// %18 = matmul(%15, %10) {transpose_a=True} : f32[10,500]  # lenet.ddsl:17:13 fc2
extern "C" __global__ void matmul__fc2__v18(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_gemm(out, in0, in1, 10, 500, 64, 1, 0);
}

// %20 = channel_sum(%19) : f32[500]  # lenet.ddsl:16:13 fc1
// a0 = (sum[r0:64] in0[r0, i0])
extern "C" __global__ void channel_sum__fc1__v20(float* out0, const float* in0) {
  const int yo = blockIdx.y;
  const int lo0 = (int) ((long long) yo * 64 / 1), hi0 = (int) ((long long) (yo + 1) * 64 / 1);
  DD_BLOCK_STRIDE(e, 500) {
    const int i0 = e;
    double a0 = 0.0;
    #pragma unroll 4
    for (int r0 = lo0 + threadIdx.x; r0 < hi0; r0 += blockDim.x) {
      a0 += (double) (in0[500 * r0 + i0]);
    }
    a0 = dd_block_sum_double(a0);
    if (threadIdx.x == 0) {
      const float r0 = ((float) a0);
      out0[e] = r0;
    }
  }
}

// %21 = matmul(%19, %fc1.W) : f32[64,800]  # lenet.ddsl:16:13 fc1
extern "C" __global__ void matmul__fc1__v21(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_gemm(out, in0, in1, 64, 800, 500, 0, 0);
}

// %24 = max_pool2d_backward(%5, %6, %23) {kernel=(2, 2), pad=(0, 0), stride=(2, 2)} : f32[64,50,8,8]  # lenet.ddsl:15:13 mp
extern "C" __global__ void max_pool2d_backward__mp__v24(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1, const float* __restrict__ in2) {
  dd_max_pool2d_backward(out, in0, in1, in2, 3200, 8, 8, 4, 4, 2, 2, 2, 2, 0, 0);
}

// %25 = channel_sum(%24) : f32[50]  # lenet.ddsl:14:13 cv2
// a0 = (sum[r0:64, r2:64] in0[r0, i0, r2])
extern "C" __global__ void channel_sum__cv2__v25(float* out0, double* part0, const float* in0) {
  const int yo = blockIdx.y, yi = 0;
  const int lo0 = (int) ((long long) yo * 64 / 11), hi0 = (int) ((long long) (yo + 1) * 64 / 11);
  const int lo1 = (int) ((long long) yi * 64 / 1), hi1 = (int) ((long long) (yi + 1) * 64 / 1);
  DD_BLOCK_STRIDE(e, 50) {
    const int i0 = e;
    double a0 = 0.0;
    for (int r0 = lo0; r0 < hi0; r0++) {
      #pragma unroll 4
      for (int r2 = lo1 + threadIdx.x; r2 < hi1; r2 += blockDim.x) {
        a0 += (double) (in0[3200 * r0 + 64 * i0 + r2]);
      }
    }
    a0 = dd_block_sum_double(a0);
    if (threadIdx.x == 0) {
      part0[blockIdx.y * 50 + e] = a0;
    }
  }
  if (dd_last_block()) {
    for (int e = threadIdx.x; e < 50; e += blockDim.x) {
      double t0 = 0.0;
      for (int y = 0; y < 11; y++) t0 += __ldcg(&part0[y * 50 + e]);
      const float r0 = ((float) t0);
      out0[e] = r0;
    }
  }
}

// %26 = conv2d_backward_data(%24, %cv2.W) {groups=1, in_shape=(64, 20, 12, 12), pad=(0, 0), stride=(1, 1)} : f32[64,20,12,12]  # lenet.ddsl:14:13 cv2
extern "C" __global__ void conv2d_backward_data__cv2__v26(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_conv2d_backward_data_igemm(out, in0, in1, 64, 20, 12, 12, 50, 5, 5, 8, 8, 1, 1, 0, 0, 1, 1, 1);
}

// %27 = conv2d_backward_filter(%3, %24) {groups=1, pad=(0, 0), stride=(1, 1), w_shape=(50, 20, 5, 5)} : f32[50,20,5,5]  # lenet.ddsl:14:13 cv2
extern "C" __global__ void conv2d_backward_filter__cv2__v27(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1, float* __restrict__ ws) {
  dd_conv2d_backward_filter(out, in0, in1, ws, 16, 64, 20, 12, 12, 50, 5, 5, 8, 8, 1, 1, 0, 0, 1, 1, 1);
}

// %27 = conv2d_backward_filter(%3, %24) {groups=1, pad=(0, 0), stride=(1, 1), w_shape=(50, 20, 5, 5)} : f32[50,20,5,5]  # lenet.ddsl:14:13 cv2
extern "C" __global__ void conv2d_backward_filter__cv2__v27_finish(float* __restrict__ out, const float* __restrict__ in0) {
  dd_conv2d_backward_filter_finish(out, in0, 25000, 16);
}

// %28 = max_pool2d_backward(%2, %3, %26) {kernel=(2, 2), pad=(0, 0), stride=(2, 2)} : f32[64,20,24,24]  # lenet.ddsl:15:13 mp
extern "C" __global__ void max_pool2d_backward__mp__v28(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1, const float* __restrict__ in2) {
  dd_max_pool2d_backward(out, in0, in1, in2, 1280, 24, 24, 12, 12, 2, 2, 2, 2, 0, 0);
}

// %29 = channel_sum(%28) : f32[20]  # lenet.ddsl:13:13 cv1
// a0 = (sum[r0:64, r2:576] in0[r0, i0, r2])
extern "C" __global__ void channel_sum__cv1__v29(float* out0, double* part0, const float* in0) {
  const int yo = blockIdx.y, yi = 0;
  const int lo0 = (int) ((long long) yo * 64 / 27), hi0 = (int) ((long long) (yo + 1) * 64 / 27);
  const int lo1 = (int) ((long long) yi * 576 / 1), hi1 = (int) ((long long) (yi + 1) * 576 / 1);
  DD_BLOCK_STRIDE(e, 20) {
    const int i0 = e;
    double a0 = 0.0;
    for (int r0 = lo0; r0 < hi0; r0++) {
      #pragma unroll 4
      for (int r2 = lo1 + threadIdx.x; r2 < hi1; r2 += blockDim.x) {
        a0 += (double) (in0[11520 * r0 + 576 * i0 + r2]);
      }
    }
    a0 = dd_block_sum_double(a0);
    if (threadIdx.x == 0) {
      part0[blockIdx.y * 20 + e] = a0;
    }
  }
  if (dd_last_block()) {
    for (int e = threadIdx.x; e < 20; e += blockDim.x) {
      double t0 = 0.0;
      for (int y = 0; y < 27; y++) t0 += __ldcg(&part0[y * 20 + e]);
      const float r0 = ((float) t0);
      out0[e] = r0;
    }
  }
}

// %31 = conv2d_backward_filter(%x, %28) {groups=1, pad=(0, 0), stride=(1, 1), w_shape=(20, 1, 5, 5)} : f32[20,1,5,5]  # lenet.ddsl:13:13 cv1
extern "C" __global__ void conv2d_backward_filter__cv1__v31(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1, float* __restrict__ ws) {
  dd_conv2d_backward_filter(out, in0, in1, ws, 144, 64, 1, 28, 28, 20, 5, 5, 24, 24, 1, 1, 0, 0, 1, 1, 1);
}

// %31 = conv2d_backward_filter(%x, %28) {groups=1, pad=(0, 0), stride=(1, 1), w_shape=(20, 1, 5, 5)} : f32[20,1,5,5]  # lenet.ddsl:13:13 cv1
extern "C" __global__ void conv2d_backward_filter__cv1__v31_finish(float* __restrict__ out, const float* __restrict__ in0) {
  dd_conv2d_backward_filter_finish(out, in0, 500, 144);
}

// %22 = matmul(%19, %7) {transpose_a=True} : f32[500,800]  # lenet.ddsl:16:13 fc1
extern "C" __global__ void matmul__fc1__v22(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_gemm(out, in0, in1, 500, 800, 64, 1, 0);
}

// one launch for the updates of 8 tensors (3 kinds of loop): cv1.W, cv1.b, cv2.W, cv2.b, fc1.W, fc1.b, fc2.W, fc2.b
extern "C" __global__ void multi_tensor_sgd_momentum_sgd_step__opt_cv1_W_momentum__v32(const long long* __restrict__ t) {
  int lo = 0, hi = (int) t[0] - 1;  // the block's segment: the last whose first block is not after it
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t[1 + mid * 9] <= (long long) blockIdx.x) lo = mid; else hi = mid - 1;
  }
  const long long* row = t + 1 + lo * 9;
  const int n = (int) row[2];
  const int stride = (int) row[1] * blockDim.x;
  const int first = ((int) blockIdx.x - (int) row[0]) * blockDim.x + threadIdx.x;
  switch ((int) row[3]) {
  case 0: {
    float* out0 = (float*) row[4];
    float* out1 = (float*) row[5];
    const float* in0 = (const float*) row[6];
    const float* in1 = (const float*) row[7];
    const float* in2 = (const float*) row[8];
    for (int e = first; e < n; e += stride) {
      const float r0 = (((0.9f * in0[e]) + in1[e]) + (0.0005f * in2[e]));
      out0[e] = r0;
      const float r1 = (in2[e] - (0.01f * r0));
      out1[e] = r1;
    }
    break;
  }
  case 1: {
    float* out0 = (float*) row[4];
    float* out1 = (float*) row[5];
    const float* in0 = (const float*) row[6];
    const float* in1 = (const float*) row[7];
    const float* in2 = (const float*) row[8];
    for (int e = first; e < n; e += stride) {
      const float r0 = (((0.9f * in0[e]) + in1[e]) + (0.0005f * in2[e]));
      out0[e] = r0;
      const float r1 = (in2[e] - (0.01f * r0));
      out1[e] = r1;
    }
    break;
  }
  case 2: {
    float* out0 = (float*) row[4];
    float* out1 = (float*) row[5];
    const float* in0 = (const float*) row[6];
    const float* in1 = (const float*) row[7];
    const float* in2 = (const float*) row[8];
    for (int e = first; e < n; e += stride) {
      const float r0 = (((0.9f * in0[e]) + in1[e]) + (0.0005f * in2[e]));
      out0[e] = r0;
      const float r1 = (in2[e] - (0.01f * r0));
      out1[e] = r1;
    }
    break;
  }
  }
}
