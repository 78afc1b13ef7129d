package deepdsl.runtime;

import java.util.List;
import java.util.Map;

/**
 * Where this process stands in a data-parallel run: its rank, the number of ranks, its rank on its
 * machine (whose GPU it takes) and the launcher that said so, read from the environment the
 * launchers already set, in this order:
 *
 * <ul>
 *   <li>torchrun, Kubeflow's PyTorchJob: {@code RANK}, {@code WORLD_SIZE}, {@code LOCAL_RANK}
 *       (rendezvous {@code MASTER_ADDR}, {@code MASTER_PORT});
 *   <li>Open MPI's {@code mpirun}: {@code OMPI_COMM_WORLD_RANK}, {@code OMPI_COMM_WORLD_SIZE},
 *       {@code OMPI_COMM_WORLD_LOCAL_RANK};
 *   <li>MPICH's (hydra) {@code mpiexec}: {@code PMI_RANK}, {@code PMI_SIZE}, {@code
 *       MPI_LOCALRANKID};
 *   <li>Slurm's {@code srun}: {@code SLURM_PROCID}, {@code SLURM_NTASKS}, {@code SLURM_LOCALID}
 *       (last: an MPI job under srun sets both, and MPI's variables say the MPI ranks).
 * </ul>
 *
 * (the order of deepdsl/distributed/world.py's {@code world_from_env}, the NumPy runner's).
 *
 * <p>The flags {@code --ranks R}, {@code --rank r} and {@code --local-rank l} override what the
 * environment says (each alone: the others still come from the environment). Without any of them the run is one process
 * (rank 0 of 1). A local rank the launcher does not set is another launcher's of the same rank and size
 * ({@code srun --mpi=pmi2}: {@code SLURM_LOCALID}), else the rank (one machine). A variable
 * that is not a whole number, or a rank outside [0, size), is an error naming the variable.
 */
public record Launch(int rank, int size, int localRank, String launcher) {
  /** One process: no collective at all. */
  public static final Launch SINGLE = new Launch(0, 1, 0, "single process");

  /** The most ranks a run takes (the size of a collective's bookkeeping; far beyond any cluster). */
  static final int MAX_RANKS = 1 << 20;

  private record Source(String launcher, String rank, String size, String local) {}

  private static final List<Source> SOURCES =
      List.of(
          new Source("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
          new Source("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
              "OMPI_COMM_WORLD_LOCAL_RANK"),
          new Source("MPICH/PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
          new Source("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"));

  /** This process's place from the process environment and the flags (null where not given). */
  public static Launch of(Integer ranksFlag, Integer rankFlag, Integer localFlag) {
    return of(System.getenv(), ranksFlag, rankFlag, localFlag);
  }

  /**
   * The place {@code env} and the flags give.
   *
   * @throws IllegalArgumentException naming the variable or flag that is wrong
   */
  public static Launch of(Map<String, String> env, Integer ranksFlag, Integer rankFlag, Integer localFlag) {
    Integer rank = null;
    Integer size = null;
    Integer local = null;
    String launcher = null;
    for (Source s : SOURCES) {
      if (env.containsKey(s.rank()) || env.containsKey(s.size())) {
        if (!env.containsKey(s.rank()) || !env.containsKey(s.size())) {
          throw new IllegalArgumentException(
              "the environment sets "
                  + (env.containsKey(s.rank()) ? s.rank() : s.size())
                  + " but not "
                  + (env.containsKey(s.rank()) ? s.size() : s.rank())
                  + " (the "
                  + s.launcher()
                  + " launch sets both)");
        }
        rank = whole(s.rank(), env.get(s.rank()), 0);
        size = whole(s.size(), env.get(s.size()), 1);
        local =
            env.containsKey(s.local())
                ? Integer.valueOf(whole(s.local(), env.get(s.local()), 0))
                : sameWorldLocal(env, rank, size);
        launcher = s.launcher();
        break;
      }
    }
    if (ranksFlag != null) {
      size = ranksFlag;
      launcher = launcher == null ? "--ranks" : launcher + ", --ranks";
    }
    if (rankFlag != null) {
      rank = rankFlag;
      launcher = launcher == null ? "--rank" : launcher + ", --rank";
    }
    if (localFlag != null) {
      local = localFlag;
    }
    if (size == null && rank == null) {
      return SINGLE;
    }
    if (size == null) {
      throw new IllegalArgumentException("--rank " + rank + " needs --ranks R (or a launcher's environment)");
    }
    if (rank == null) {
      if (size == 1) {
        rank = 0;
      } else {
        throw new IllegalArgumentException(
            "--ranks " + size + " needs this process's rank: --rank r, or a launcher's environment"
                + " (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID)");
      }
    }
    if (size < 1 || size > MAX_RANKS) {
      throw new IllegalArgumentException("the number of ranks is " + size + ", not in [1, " + MAX_RANKS + "]");
    }
    if (rank < 0 || rank >= size) {
      throw new IllegalArgumentException(
          "rank " + rank + " is not in [0, " + size + ") (" + launcher + ")");
    }
    return new Launch(rank, size, local != null ? local : rank, launcher);
  }

  /**
   * The local rank where the launcher that says the rank sets none: another launcher's whose rank and
   * size are the same (Slurm's pmi2 plugin sets PMI_RANK and PMI_SIZE but not MPICH's MPI_LOCALRANKID;
   * SLURM_LOCALID restarts at 0 on each node), else null.
   */
  private static Integer sameWorldLocal(Map<String, String> env, int rank, int size) {
    for (Source s : SOURCES) {
      String r = env.getOrDefault(s.rank(), "").strip();
      String n = env.getOrDefault(s.size(), "").strip();
      if (r.equals(Integer.toString(rank)) && n.equals(Integer.toString(size)) && env.containsKey(s.local())) {
        return whole(s.local(), env.get(s.local()), 0);
      }
    }
    return null;
  }

  private static int whole(String name, String value, int low) {
    String v = value == null ? "" : value.strip();
    if (v.matches("[0-9]{1,9}")) {
      int n = Integer.parseInt(v);
      if (n >= low) {
        return n;
      }
    }
    throw new IllegalArgumentException(
        "the environment's " + name + " is '" + value + "', not a whole number >= " + low);
  }

  /** More than one rank: the steps all-reduce their gradients. */
  public boolean distributed() {
    return size > 1;
  }

  /**
   * The address {@code host:port} of NCCL's rendezvous: {@code NCCL_COMM_ID} where set, else {@code
   * MASTER_ADDR:(MASTER_PORT+1)} (torchrun's store holds MASTER_PORT itself), else null (the ranks
   * then share NCCL's id through MPI).
   */
  public static String ncclRendezvous(Map<String, String> env) {
    String id = env.get("NCCL_COMM_ID");
    if (id != null && !id.isBlank()) {
      return id;
    }
    String host = env.get("MASTER_ADDR");
    String port = env.get("MASTER_PORT");
    if (host == null || host.isBlank() || port == null) {
      return null;
    }
    int p = whole("MASTER_PORT", port, 1);
    if (p >= 65535) {
      throw new IllegalArgumentException(
          "the environment's MASTER_PORT is " + p + ": NCCL's rendezvous takes MASTER_PORT+1, not a port");
    }
    return (host.contains(":") && !host.startsWith("[") ? "[" + host + "]" : host) + ":" + (p + 1);
  }

  @Override
  public String toString() {
    return "rank " + rank + " of " + size + " (local rank " + localRank + ", " + launcher + ")";
  }
}
