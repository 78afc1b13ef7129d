package deepdsl.runtime;

import java.io.IOException;
import java.io.InputStream;
import java.util.HashMap;
import java.util.Map;

/**
 * Data-parallel training and gradient accumulation for a program compiled with the data-parallel
 * pass ({@code deepdsl compile --data-parallel}; docs/distributed.md): W ranks (processes, each on
 * its own device) and M micro-batches per rank and step. The same compiled program runs with any W
 * and M, one and one included, where it equals the plain program bit for bit.
 *
 * <p>At step i, rank r's micro-batch k reads batch {@code b = (i W + r) M + k} of the data (sample
 * positions {@code [b N, (b + 1) N)}), so the shards of a step are the one-process batch of W M N.
 * The setting {@code dp/scale} is {@code 1 / (W M)}: each bucket is packed times it (the step's
 * {@code allReduceStart}) and summed over the ranks by the {@link Collective} (never averaged:
 * two ranks then equal two micro-batches bit for bit). With M > 1 the statements before the
 * reductions run once per micro-batch, each bucket summed into an accumulator in micro-batch order,
 * and the rest (the updates) once, after the accumulators are reduced and copied back at the
 * waits. The device runs the parts ({@link Device#microBatchPre}, {@link Device#microBatchPost}) and
 * holds the accumulators ({@link Device#accumulator}): the CPU device in host arrays, the CUDA device
 * on the GPU (micro-batch 0 copied, the others added by a kernel), its steps then call for call.
 */
final class DataParallel {
  private final Launch launch;
  private final int micro;
  private final Collective collective;
  // micro-batches: each bucket's accumulator, and whether the current step has written it yet
  private final Map<Integer, Buf> sums = new HashMap<>();
  private int microBatch; // the micro-batch the step's statements run for
  private boolean failed;

  /** One process, one micro-batch: the plain program. */
  static final DataParallel NONE = new DataParallel(Launch.SINGLE, 1, Collective.SINGLE);

  private DataParallel(Launch launch, int micro, Collective collective) {
    this.launch = launch;
    this.micro = micro;
    this.collective = collective;
  }

  /**
   * The run of {@code net} on {@code device} for {@code launch} with {@code micro} micro-batches:
   * opens the collective (MPI or NCCL), sets the scale, and checks that every rank starts from the
   * same program and parameters.
   *
   * @throws Device.Unavailable when the program was not compiled for it, the device cannot
   *     accumulate, or the collective does not start
   */
  static DataParallel open(Launch launch, int micro, Device device, Network net) {
    if (!launch.distributed() && micro == 1 && !(Collective.forced() && net.isDataParallel())) {
      if (net.isDataParallel()) {
        net.set(Network.SCALE, 1.0);
      }
      return NONE;
    }
    if (!net.isDataParallel()) {
      throw new Device.Unavailable(
          (launch.distributed() ? launch.size() + " ranks (" + launch.launcher() + ")" : "--micro-batches " + micro)
              + ": this program was compiled without the data-parallel pass; compile it with"
              + " `deepdsl compile --data-parallel` (one program then serves any number of ranks)");
    }
    if (micro > 1 && net.syncsBatchNorm()) {
      throw new Device.Unavailable(
          "--micro-batches " + micro + ": this program synchronises batch norm (compiled with sync_batch_norm):"
              + " a batch norm's statistics would be over one micro-batch of each rank, neither the global"
              + " batch's nor those of gradient accumulation; compile it without sync_batch_norm to accumulate");
    }
    if (micro > 1 && !net.accumulates()) { // (a forced collective with one rank reduces over that rank)
      throw new Device.Unavailable(
          "--micro-batches " + micro + ": this program's updates are not separable from its backward pass in"
              + " its memory plan, so it cannot accumulate micro-batches");
    }
    if (micro > 1) {
      device.accumulates(micro);
    }
    net.set(Network.SCALE, 1.0 / ((double) launch.size() * micro));
    Collective c = Collective.open(launch, device);
    return new DataParallel(launch, micro, c);
  }

  /** The system property naming the CUDA device's GPU (CudaDevice); a rank takes its LOCAL_RANK's. */
  static final String GPU_PROPERTY = "deepdsl.gpu";

  /**
   * This process's place from the launcher's environment and the flags; sets the GPU of a rank to
   * its local rank's (unless {@code -Ddeepdsl.gpu} names one).
   *
   * @throws IllegalArgumentException naming the variable or flag that is wrong
   */
  static Launch launch(CommandLine flags) {
    Launch launch = Launch.of(flags.ranks, flags.rank, flags.localRank);
    if (launch.distributed() && System.getProperty(GPU_PROPERTY) == null) {
      System.setProperty(GPU_PROPERTY, Integer.toString(launch.localRank()));
    }
    return launch;
  }

  Launch launch() {
    return launch;
  }

  /** Says on {@code out} how the run is distributed, where it is. */
  void describe(java.io.PrintStream out) {
    String d = description();
    if (d != null) {
      out.println(d);
    }
  }

  int microBatches() {
    return micro;
  }

  /** The collective's line for the user, or null for one process. */
  String description() {
    if (collective == Collective.SINGLE && micro == 1) {
      return null;
    }
    String micros = micro > 1 ? ", " + micro + " micro-batches a step" : "";
    return "data parallel: rank " + launch.rank() + " of " + launch.size() + " (" + launch.launcher() + "), "
        + collective.description() + micros;
  }

  /**
   * The start-up check: every rank has the same program (the generated class's bytes) and the same
   * parameters, model state and step counter; else every rank stops naming those that differ.
   */
  void agree(Network net) {
    if (collective == Collective.SINGLE) {
      return;
    }
    long h = 0xcbf29ce484222325L;
    String resource = net.getClass().getName().replace('.', '/') + ".class";
    try (InputStream in = net.getClass().getClassLoader().getResourceAsStream(resource)) {
      if (in != null) {
        for (byte b : in.readAllBytes()) {
          h = (h ^ (b & 0xff)) * 0x100000001b3L;
        }
      }
    } catch (IOException e) {
      // the parameters alone
    }
    for (Map.Entry<String, Buf> t : net.tensorsByName().entrySet()) {
      for (char ch : t.getKey().toCharArray()) {
        h = (h ^ ch) * 0x100000001b3L;
      }
      Buf b = t.getValue();
      for (int k = 0; k < b.numel(); k++) {
        h = (h ^ Float.floatToRawIntBits(b.a[b.off + k])) * 0x100000001b3L;
      }
    }
    h = (h ^ net.iteration) * 0x100000001b3L;
    collective.agree(h >>> 1, "the program or its parameters (the checksum of the class and every tensor)");
  }

  /** The first sample of this rank's micro-batch in the step's global batch of {@code n} a shard. */
  long offset(int n) {
    return ((long) launch.rank() * micro + microBatch) * n;
  }

  /** One training step of {@code net}: its shard or micro-batches, the reductions; returns the loss. */
  float trainStep(Network net, Long shuffle) {
    long first = (net.iteration * launch.size() + launch.rank()) * micro;
    if (micro == 1) {
      net.batch(first, shuffle);
      collective.beginStep();
      float loss = net.device().trainStep(net);
      collective.endStep();
      return loss;
    }
    Device dev = net.device();
    collective.beginStep();
    for (int k = 0; k < micro; k++) {
      microBatch = k;
      net.batch(first + k, shuffle);
      dev.microBatchPre(net);
    }
    float loss = dev.microBatchPost(net);
    collective.endStep();
    return loss;
  }

  /** The step's {@code allReduceStart}: packs the bucket, then starts its sum (or adds it up). */
  void start(Device dev, int bucket, Buf out, Buf scale, Buf... parts) {
    dev.pack(out, scale, parts);
    if (micro == 1) {
      collective.start(bucket, out);
      return;
    }
    Buf sum = sums.computeIfAbsent(bucket, b -> dev.accumulator(out.numel()));
    dev.accumulate(sum, out, microBatch == 0);
    if (microBatch == micro - 1) {
      collective.start(bucket, sum);
    }
  }

  /** The step's {@code allReduceWait}: the bucket's sum over the ranks (and micro-batches) in {@code out}. */
  void await(Device dev, int bucket, Buf out) {
    collective.await(bucket);
    if (micro > 1) {
      dev.accumulate(out, sums.get(bucket), true);
    }
  }

  /** The run failed on this rank: closing then stops every rank. */
  void fail() {
    failed = true;
    collective.fail();
  }

  void close() {
    if (failed) {
      collective.fail();
    }
    collective.close();
  }
}
