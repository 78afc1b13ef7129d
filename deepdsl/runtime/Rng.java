package deepdsl.runtime;

import java.math.BigDecimal;
import java.math.MathContext;
import java.nio.charset.StandardCharsets;

/**
 * The SplitMix64 stream shared with the Python side ({@code deepdsl/initializers.py}), bit for bit.
 *
 * <p>A stream seeded with {@code s} yields, as its k-th output (k = 0, 1, ...), {@code mix(s + (k +
 * 1) * GAMMA)}, all arithmetic mod 2^64. A parameter's stream is seeded with {@code seed XOR
 * fnv1a64(name)}. Uniforms take the top 24 bits ({@code (next() >>> 40) * 2^-24}); normals are
 * Box-Muller on two consecutive uniforms, keeping the cosine half only.
 */
public final class Rng {
  /** The SplitMix64 increment. */
  private static final long GAMMA = 0x9E3779B97F4A7C15L;

  /** Mixed into a dropout site's seed once per step (see {@link #maskSeed}). */
  private static final long STEP_MIX = 0xD1B54A32D192ED03L;

  private static final long FNV_OFFSET = 0xCBF29CE484222325L;
  private static final long FNV_PRIME = 0x100000001B3L;
  private static final double U24 = 0x1.0p-24;
  private static final double TWO_PI = 2.0 * Math.PI;

  private long state;

  /** A stream seeded with {@code seed}, positioned at its first output. */
  public Rng(long seed) {
    this.state = seed;
  }

  /**
   * The stream seeded with {@code seed}, positioned so that the next output is output {@code
   * start}.
   */
  public static Rng at(long seed, long start) {
    return new Rng(seed + start * GAMMA);
  }

  /** The next raw output, an unsigned 64-bit value. */
  public long next() {
    state += GAMMA;
    return mix(state);
  }

  /** The next 24 random bits, {@code next() >>> 40}. */
  public int bits24() {
    return (int) (next() >>> 40);
  }

  /** {@code (next() >>> 40) * 2^-24}: a double in [0, 1) that float32 represents exactly. */
  public double uniform() {
    return bits24() * U24;
  }

  /** A standard normal from the next two uniforms (Box-Muller, cosine half only), in double. */
  public double normal() {
    double u1 = uniform();
    double u2 = uniform();
    return Math.sqrt(-2.0 * StrictMath.log(1.0 - u1)) * StrictMath.cos(TWO_PI * u2);
  }

  /** The SplitMix64 output function. */
  private static long mix(long z) {
    z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
    z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
    return z ^ (z >>> 31);
  }

  /** 64-bit FNV-1a hash of the UTF-8 bytes of {@code s}. */
  public static long fnv1a64(String s) {
    long h = FNV_OFFSET;
    for (byte b : s.getBytes(StandardCharsets.UTF_8)) {
      h = (h ^ (b & 0xFF)) * FNV_PRIME;
    }
    return h;
  }

  /** The seed of the stream called {@code name}: {@code seed XOR fnv1a64(name)}. */
  public static long streamSeed(String name, long seed) {
    return seed ^ fnv1a64(name);
  }

  /**
   * The seed of dropout site {@code site}'s mask at {@code step}: {@code streamSeed(site +
   * "#dropout", seed) XOR ((step + 1) * STEP_MIX)}, mod 2^64.
   */
  public static long maskSeed(String site, long seed, long step) {
    return streamSeed(site + "#dropout", seed) ^ ((step + 1) * STEP_MIX);
  }

  /**
   * The registry op {@code dropout_mask} (the CPU device calls it): the inverted-dropout mask of
   * {@code site} at {@code step}: element i (row-major) of {@code out}
   * is {@code 1 / (1 - p)} when uniform i of the stream {@link #maskSeed} is at least {@code p},
   * else 0.
   *
   * <p>The Python side compares with the double {@code p} the program wrote; {@code p} arrives here
   * rounded to float, so it is widened to the shortest decimal that rounds to it ({@code 0.7f} to
   * {@code 0.7}), which is that double whenever the program wrote {@code p} with up to 6
   * significant digits. (Widening with a plain cast would move the threshold past a multiple of
   * 2^-24 for some {@code p}, changing the mask.)
   */
  public static void dropout_mask(Buf out, long step, float p, long seed, String site) {
    mask(out, new Rng(maskSeed(site, seed, step)), p);
  }

  /**
   * The registry op {@code dropout_mask_at} (data parallelism): the mask of a shard whose first
   * sample is sample {@code offset} of the step's global batch, its draws from uniform {@code offset
   * x (numel / rows)} of the stream on: the shards draw the whole batch's mask.
   */
  public static void dropout_mask_at(Buf out, long step, long offset, float p, long seed, String site) {
    mask(out, at(maskSeed(site, seed, step), offset * (out.numel() / out.shape[0])), p);
  }

  private static void mask(Buf out, Rng rng, float p) {
    double threshold = shortestDecimal(p);
    float scale = (float) (1.0 / (1.0 - threshold));
    int n = out.numel();
    for (int i = 0; i < n; i++) {
      out.a[out.off + i] = rng.uniform() >= threshold ? scale : 0.0f;
    }
  }

  /**
   * The seed of sampling site {@code site}'s draws at {@code step}: {@code streamSeed(site +
   * "#sample", seed) XOR ((step + 1) * STEP_MIX)}, mod 2^64 (deepdsl/ops/random.py).
   */
  public static long sampleSeed(String site, long seed, long step) {
    return streamSeed(site + "#sample", seed) ^ ((step + 1) * STEP_MIX);
  }

  /**
   * The registry op {@code random_normal}: element i (row-major) of {@code out} is the normal of
   * uniforms 2i and 2i + 1 of the stream {@link #sampleSeed} (Box-Muller, as {@link #normal}),
   * rounded to float.
   */
  public static void random_normal(Buf out, long step, long seed, String site) {
    normals(out, new Rng(sampleSeed(site, seed, step)));
  }

  /** {@code random_normal} of the shard from sample {@code offset} of the global batch (two uniforms a draw). */
  public static void random_normal_at(Buf out, long step, long offset, long seed, String site) {
    normals(out, at(sampleSeed(site, seed, step), 2 * offset * (out.numel() / out.shape[0])));
  }

  private static void normals(Buf out, Rng rng) {
    int n = out.numel();
    for (int i = 0; i < n; i++) {
      out.a[out.off + i] = (float) rng.normal();
    }
  }

  /**
   * The registry op {@code random_uniform}: element i of {@code out} is {@code low + (high - low) *
   * u_i} in double, u_i uniform i of the stream {@link #sampleSeed}, rounded to float. {@code low}
   * and {@code high} arrive rounded to float and are widened as dropout's p is ({@link
   * #shortestDecimal}), to the doubles the program wrote.
   */
  public static void random_uniform(Buf out, long step, float low, float high, long seed, String site) {
    uniforms(out, new Rng(sampleSeed(site, seed, step)), low, high);
  }

  /** {@code random_uniform} of the shard from sample {@code offset} of the global batch. */
  public static void random_uniform_at(
      Buf out, long step, long offset, float low, float high, long seed, String site) {
    uniforms(out, at(sampleSeed(site, seed, step), offset * (out.numel() / out.shape[0])), low, high);
  }

  private static void uniforms(Buf out, Rng rng, float low, float high) {
    double lo = shortestDecimal(low);
    double hi = shortestDecimal(high);
    int n = out.numel();
    for (int i = 0; i < n; i++) {
      out.a[out.off + i] = (float) (lo + (hi - lo) * rng.uniform());
    }
  }

  /** The double nearest the shortest decimal that rounds to {@code f}. */
  static double shortestDecimal(float f) {
    if (!Float.isFinite(f) || f == 0.0f) {
      return f;
    }
    BigDecimal exact = new BigDecimal(f);
    for (int digits = 1; ; digits++) {
      BigDecimal d = exact.round(new MathContext(digits));
      if (d.floatValue() == f) {
        return d.doubleValue();
      }
    }
  }
}
