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
// out[i0] = (sum[r0:64] in0[r0, i0])
extern "C" __global__ void channel_sum__fc2__v16(float* out, const float* in0) {
  DD_BLOCK_STRIDE(e, 10) {
    int i0 = e;
    float s0 = 0.0f;
    for (int t = threadIdx.x; t < 64; t += blockDim.x) {
      int r0 = t;
      s0 += in0[10 * r0 + i0];
    }
    s0 = dd_block_sum(s0);
    if (threadIdx.x == 0) out[e] = s0;
  }
}

// %18 = matmul(%15, %10) {transpose_a=True} : f32[10,500]  # lenet.ddsl:17:13 fc2
extern "C" __global__ void matmul__fc2__v18(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_gemm(out, in0, in1, 10, 500, 64, 1, 0);
}

// %19 = matmul(%15, %fc2.W, %10) {epilogue=((%10[i0, i1] > 0) ? $result[i0, i1] : 0)} : f32[64,500]  # lenet.ddsl:17:13 fc2
extern "C" __global__ void matmul__fc2__v19(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_gemm(out, in0, in1, 64, 500, 10, 0, 0);
}

// epilogue of %19: out[i0, i1] = ((in1[i0, i1] > 0) ? out[i0, i1] : 0)
extern "C" __global__ void matmul__fc2__v19_epilogue(float* out, const float* in0, const float* in1) {
  DD_GRID_STRIDE(e, 32000) {
    out[e] = ((in1[e] > 0.0f) ? in0[e] : 0.0f);
  }
}

// %20 = channel_sum(%19) : f32[500]  # lenet.ddsl:16:13 fc1
// out[i0] = (sum[r0:64] in0[r0, i0])
extern "C" __global__ void channel_sum__fc1__v20(float* out, const float* in0) {
  DD_BLOCK_STRIDE(e, 500) {
    int i0 = e;
    float s0 = 0.0f;
    for (int t = threadIdx.x; t < 64; t += blockDim.x) {
      int r0 = t;
      s0 += in0[500 * r0 + i0];
    }
    s0 = dd_block_sum(s0);
    if (threadIdx.x == 0) out[e] = s0;
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
// out[i0] = (sum[r0:64, r2:8, r3:8] in0[r0, i0, r2, r3])
extern "C" __global__ void channel_sum__cv2__v25(float* out, const float* in0) {
  DD_BLOCK_STRIDE(e, 50) {
    int i0 = e;
    float s0 = 0.0f;
    for (int t = threadIdx.x; t < 4096; t += blockDim.x) {
      int r0 = t / 64;
      int r2 = t / 8 % 8;
      int r3 = t % 8;
      s0 += in0[3200 * r0 + 64 * i0 + 8 * r2 + r3];
    }
    s0 = dd_block_sum(s0);
    if (threadIdx.x == 0) out[e] = s0;
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
// out[i0] = (sum[r0:64, r2:24, r3:24] in0[r0, i0, r2, r3])
extern "C" __global__ void channel_sum__cv1__v29(float* out, const float* in0) {
  DD_BLOCK_STRIDE(e, 20) {
    int i0 = e;
    float s0 = 0.0f;
    for (int t = threadIdx.x; t < 36864; t += blockDim.x) {
      int r0 = t / 576;
      int r2 = t / 24 % 24;
      int r3 = t % 24;
      s0 += in0[11520 * r0 + 576 * i0 + 24 * r2 + r3];
    }
    s0 = dd_block_sum(s0);
    if (threadIdx.x == 0) out[e] = s0;
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

// %32 = sgd_momentum(%opt/cv1.W/momentum, %31, %cv1.W) {inplace=1, momentum=0.9, weight_decay=0.0005} : f32[20,1,5,5]
// %33 = sgd_step(%cv1.W, %32) {lr=0.01, same_loop=True} : f32[20,1,5,5]
// also serves %42
extern "C" __global__ void sgd_momentum_sgd_step__cv1_W__v33(float* out0, float* out1, const float* in0, const float* in1, const float* in2) {
  DD_GRID_STRIDE(e, 500) {
    const float r0 = (((0.9f * in0[e]) + in1[e]) + (0.0005f * in2[e]));
    out0[e] = r0;
    const float r1 = (in2[e] - (0.01f * r0));
    out1[e] = r1;
  }
}

// %34 = sgd_momentum(%opt/cv1.b/momentum, %29, %cv1.b) {inplace=1, momentum=0.9, weight_decay=0.0005} : f32[20]
// %35 = sgd_step(%cv1.b, %34) {lr=0.01, same_loop=True} : f32[20]
extern "C" __global__ void sgd_momentum_sgd_step__cv1_b__v35(float* out0, float* out1, const float* in0, const float* in1, const float* in2) {
  DD_GRID_STRIDE(e, 20) {
    const float r0 = (((0.9f * in0[e]) + in1[e]) + (0.0005f * in2[e]));
    out0[e] = r0;
    const float r1 = (in2[e] - (0.01f * r0));
    out1[e] = r1;
  }
}

// %36 = sgd_momentum(%opt/cv2.W/momentum, %27, %cv2.W) {inplace=1, momentum=0.9, weight_decay=0.0005} : f32[50,20,5,5]
// %37 = sgd_step(%cv2.W, %36) {lr=0.01, same_loop=True} : f32[50,20,5,5]
extern "C" __global__ void sgd_momentum_sgd_step__cv2_W__v37(float* out0, float* out1, const float* in0, const float* in1, const float* in2) {
  DD_GRID_STRIDE(e, 25000) {
    const float r0 = (((0.9f * in0[e]) + in1[e]) + (0.0005f * in2[e]));
    out0[e] = r0;
    const float r1 = (in2[e] - (0.01f * r0));
    out1[e] = r1;
  }
}

// %38 = sgd_momentum(%opt/cv2.b/momentum, %25, %cv2.b) {inplace=1, momentum=0.9, weight_decay=0.0005} : f32[50]
// %39 = sgd_step(%cv2.b, %38) {lr=0.01, same_loop=True} : f32[50]
extern "C" __global__ void sgd_momentum_sgd_step__cv2_b__v39(float* out0, float* out1, const float* in0, const float* in1, const float* in2) {
  DD_GRID_STRIDE(e, 50) {
    const float r0 = (((0.9f * in0[e]) + in1[e]) + (0.0005f * in2[e]));
    out0[e] = r0;
    const float r1 = (in2[e] - (0.01f * r0));
    out1[e] = r1;
  }
}

// %22 = matmul(%19, %7) {transpose_a=True} : f32[500,800]  # lenet.ddsl:16:13 fc1
extern "C" __global__ void matmul__fc1__v22(float* __restrict__ out, const float* __restrict__ in0, const float* __restrict__ in1) {
  dd_gemm(out, in0, in1, 500, 800, 64, 1, 0);
}

// %40 = sgd_momentum(%opt/fc1.W/momentum, %22, %fc1.W) {inplace=1, momentum=0.9, weight_decay=0.0005} : f32[500,800]
// %41 = sgd_step(%fc1.W, %40) {lr=0.01, same_loop=True} : f32[500,800]
extern "C" __global__ void sgd_momentum_sgd_step__fc1_W__v41(float* out0, float* out1, const float* in0, const float* in1, const float* in2) {
  DD_GRID_STRIDE(e, 400000) {
    const float r0 = (((0.9f * in0[e]) + in1[e]) + (0.0005f * in2[e]));
    out0[e] = r0;
    const float r1 = (in2[e] - (0.01f * r0));
    out1[e] = r1;
  }
}

// %44 = sgd_momentum(%opt/fc2.W/momentum, %18, %fc2.W) {inplace=1, momentum=0.9, weight_decay=0.0005} : f32[10,500]
// %45 = sgd_step(%fc2.W, %44) {lr=0.01, same_loop=True} : f32[10,500]
extern "C" __global__ void sgd_momentum_sgd_step__fc2_W__v45(float* out0, float* out1, const float* in0, const float* in1, const float* in2) {
  DD_GRID_STRIDE(e, 5000) {
    const float r0 = (((0.9f * in0[e]) + in1[e]) + (0.0005f * in2[e]));
    out0[e] = r0;
    const float r1 = (in2[e] - (0.01f * r0));
    out1[e] = r1;
  }
}

// %46 = sgd_momentum(%opt/fc2.b/momentum, %16, %fc2.b) {inplace=1, momentum=0.9, weight_decay=0.0005} : f32[10]
// %47 = sgd_step(%fc2.b, %46) {lr=0.01, same_loop=True} : f32[10]
extern "C" __global__ void sgd_momentum_sgd_step__fc2_b__v47(float* out0, float* out1, const float* in0, const float* in1, const float* in2) {
  DD_GRID_STRIDE(e, 10) {
    const float r0 = (((0.9f * in0[e]) + in1[e]) + (0.0005f * in2[e]));
    out0[e] = r0;
    const float r1 = (in2[e] - (0.01f * r0));
    out1[e] = r1;
  }
}
