package deepdsl.runtime;

import static jcuda.driver.JCudaDriver.cuModuleLoadData;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import jcuda.driver.CUmodule;
import jcuda.nvrtc.JNvrtc;
import jcuda.nvrtc.nvrtcProgram;

/**
 * Loading a network's kernels onto the GPU for {@link CudaDevice}: {@code NAME.sm_XY.ptx} from the
 * class path for the GPU's architecture (or the newest older one, which the driver compiles
 * forward), written by {@code deepdsl compile --ptx}; else {@code NAME.cu}, compiled with NVRTC
 * ({@code libnvrtc.so.12}).
 */
final class CudaModule {
  private CudaModule() {}

  private static final int[] OLDER_ARCHS = {90, 89, 87, 86, 80, 75, 70};

  /**
   * Loads into {@code module} the PTX of network {@code name} for a GPU of architecture {@code
   * arch}, or compiles NAME.cu; returns what was loaded, for the user.
   */
  static String load(CUmodule module, String name, int arch) {
    for (int a : candidates(arch)) {
      byte[] ptx = resource(name + ".sm_" + a + ".ptx");
      if (ptx != null) {
        cuModuleLoadData(module, terminated(ptx));
        return name + ".sm_" + a + ".ptx";
      }
    }
    byte[] source = resource(name + ".cu");
    if (source == null) {
      throw new Device.Unavailable(
          "neither "
              + name
              + ".sm_"
              + arch
              + ".ptx nor "
              + name
              + ".cu is on the class path (deepdsl compile writes them beside "
              + name
              + ".java: put that folder on the class path)");
    }
    cuModuleLoadData(module, terminated(nvrtc(new String(source, StandardCharsets.UTF_8), name, arch)));
    return name + ".cu, compiled at start with NVRTC (no " + name + ".sm_" + arch + ".ptx)";
  }

  /** This architecture, then the older ones whose PTX the driver compiles forward. */
  private static int[] candidates(int arch) {
    List<Integer> out = new ArrayList<>(List.of(arch));
    for (int a : OLDER_ARCHS) {
      if (a < arch) {
        out.add(a);
      }
    }
    return out.stream().mapToInt(Integer::intValue).toArray();
  }

  private static byte[] nvrtc(String source, String name, int arch) {
    try {
      nvrtcProgram program = new nvrtcProgram();
      JNvrtc.nvrtcCreateProgram(program, source, name + ".cu", 0, null, null);
      String[] options = {"--gpu-architecture=compute_" + arch, "--std=c++17", "--fmad=true"};
      int status = JNvrtc.nvrtcCompileProgram(program, options.length, options);
      String[] log = {""};
      JNvrtc.nvrtcGetProgramLog(program, log);
      if (status != 0) {
        throw new Device.Unavailable(
            "NVRTC could not compile " + name + ".cu for sm_" + arch + ":\n" + log[0]);
      }
      String[] ptx = {null};
      JNvrtc.nvrtcGetPTX(program, ptx);
      JNvrtc.nvrtcDestroyProgram(program);
      return ptx[0].getBytes(StandardCharsets.UTF_8);
    } catch (UnsatisfiedLinkError e) {
      throw new Device.Unavailable(
          "no PTX for sm_"
              + arch
              + " on the class path, and NVRTC (libnvrtc.so.12) cannot be loaded to compile "
              + name
              + ".cu: compile with deepdsl compile --ptx --arch sm_"
              + arch);
    }
  }

  private static byte[] resource(String file) {
    ClassLoader loader = Thread.currentThread().getContextClassLoader();
    if (loader == null) {
      loader = ClassLoader.getSystemClassLoader();
    }
    try (InputStream in = loader.getResourceAsStream(file)) {
      return in == null ? null : in.readAllBytes();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static byte[] terminated(byte[] text) {
    byte[] out = new byte[text.length + 1];
    System.arraycopy(text, 0, out, 0, text.length);
    return out;
  }
}
