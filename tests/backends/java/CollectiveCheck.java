package deepdsl.runtime;

import java.util.Locale;

/**
 * The test driver of the Java collectives (tests/backends/test_java_collective.py), run once per rank
 * under mpiexec: {@code launch} prints what Launch reads from the environment and flags, {@code
 * launches FILE} the same for each line of FILE (an environment, then the flags); {@code
 * allreduce} sums two buckets of rank-dependent values (started both, awaited in reverse order) and
 * prints the sums bit for bit; {@code agree X} runs the start-up check with checksum X; {@code stall
 * S} sleeps S seconds before its all-reduce (a rank that stalls); {@code stall-inside S} the same after
 * starting it (a rank that stalls inside an all-reduce every rank has started).
 */
public final class CollectiveCheck {
  public static void main(String[] args) {
    Integer ranks = null;
    Integer rank = null;
    for (int i = 1; i + 1 < args.length; i++) {
      if (args[i].equals("--ranks")) {
        ranks = Integer.parseInt(args[i + 1]);
      } else if (args[i].equals("--rank")) {
        rank = Integer.parseInt(args[i + 1]);
      }
    }
    Launch launch;
    try {
      launch = Launch.of(ranks, rank, null);
    } catch (IllegalArgumentException e) {
      System.out.println("error: " + e.getMessage());
      return;
    }
    if (args[0].equals("launch")) {
      System.out.println(launch.rank() + " " + launch.size() + " " + launch.localRank() + " " + launch.launcher());
      return;
    }
    if (args[0].equals("launches")) { // each line of the file: VAR=VALUE ... | ranks rank localRank ('-': none)
      try {
        for (String line : java.nio.file.Files.readAllLines(java.nio.file.Path.of(args[1]))) {
          String[] halves = line.split("\\|", -1);
          java.util.Map<String, String> env = new java.util.HashMap<>();
          for (String pair : halves[0].trim().split(" ")) {
            if (!pair.isEmpty()) {
              env.put(pair.substring(0, pair.indexOf('=')), pair.substring(pair.indexOf('=') + 1));
            }
          }
          String[] f = halves[1].trim().split(" ");
          Integer[] flags = new Integer[3];
          for (int k = 0; k < 3; k++) {
            flags[k] = f[k].equals("-") ? null : Integer.valueOf(f[k]);
          }
          try {
            Launch l = Launch.of(env, flags[0], flags[1], flags[2]);
            System.out.println(l.rank() + " " + l.size() + " " + l.localRank() + " " + l.launcher() + " | "
                + Launch.ncclRendezvous(env));
          } catch (IllegalArgumentException e) {
            System.out.println("error: " + e.getMessage());
          }
        }
      } catch (java.io.IOException e) {
        throw new java.io.UncheckedIOException(e);
      }
      return;
    }
    Collective c;
    try {
      c = Collective.open(launch, new CpuDevice(0, null));
    } catch (Device.Unavailable e) {
      System.out.println("error: " + e.getMessage());
      System.exit(1);
      return;
    }
    int code = 0;
    try {
      System.err.println(c.description());
      switch (args[0]) {
        case "allreduce" -> {
          int r = launch.rank();
          Buf a = Buf.zeros(3, 5);
          Buf b = Buf.zeros(7);
          Buf d = Buf.zeros(2, 2);
          for (int k = 0; k < 15; k++) {
            a.a[k] = (float) Math.sqrt(k + 1) * (r + 1) + 0.1f * r;
          }
          for (int k = 0; k < 7; k++) {
            b.a[k] = 1e-3f * k - r;
          }
          for (int k = 0; k < 4; k++) {
            d.a[k] = 0.25f * (k + 1) * (r + 1);
          }
          c.start(0, a, b);
          c.start(1, d);
          c.await(1);
          c.await(0);
          StringBuilder s = new StringBuilder();
          for (Buf x : new Buf[] {a, b, d}) {
            for (int k = 0; k < x.numel(); k++) {
              s.append(Integer.toHexString(Float.floatToRawIntBits(x.a[x.off + k]))).append(' ');
            }
          }
          System.out.println(s.toString().strip());
        }
        case "agree" -> {
          c.agree(Long.parseLong(args[1]), "the plan's checksum");
          System.out.println("agreed");
        }
        case "stall" -> {
          Buf a = Buf.zeros(4);
          if (launch.rank() == 1) {
            Thread.sleep((long) (1000 * Double.parseDouble(args[1])));
          }
          c.start(0, a);
          c.await(0);
          System.out.println("reduced");
        }
        case "stall-inside" -> { // rank 1 starts a large all-reduce (MPI's rendezvous protocol), then stalls
          Buf a = Buf.zeros(1 << 20);
          c.start(0, a);
          if (launch.rank() == 1) {
            Thread.sleep((long) (1000 * Double.parseDouble(args[1])));
          }
          c.await(0);
          System.out.println("reduced");
        }
        default -> throw new IllegalArgumentException(args[0]);
      }
    } catch (Device.Unavailable e) {
      System.out.println(String.format(Locale.ROOT, "error: %s", e.getMessage()));
      c.fail();
      code = 1;
    } catch (InterruptedException e) {
      code = 3;
    } finally {
      c.close();
    }
    System.exit(code);
  }
}
