package deepdsl.runtime;

import java.util.ArrayList;
import java.util.List;

/**
 * Data augmentation of the train block's {@code augment} on the image input {@code [n, C, H, W]},
 * as {@code deepdsl/data/augment.py} does it, bit for bit: on training batches a random crop with
 * zero padding, a horizontal flip and a per-channel normalisation in the order written; on test
 * and prediction batches the normalisation only. The draws of the sample at position q of the run
 * come from the stream {@code Rng.streamSeed("augment/" + q, seed)}: crop takes {@code dy = next()
 * mod (2ph + 1)}, then {@code dx = next() mod (2pw + 1)} (unsigned); flip {@code u = (next() >>>
 * 40) * 2^-24} and mirrors when {@code u < p}.
 */
public final class Augment {
  private record Step(String kind, int padH, int padW, double p, float[] mean, float[] std) {}

  /** The name of the image input the steps apply to. */
  public final String input;

  private final List<Step> steps = new ArrayList<>();

  public Augment(String input) {
    this.input = input;
  }

  /** A random crop of the image's own size after padding with zeros by {@code padH}, {@code padW}. */
  public Augment crop(int padH, int padW) {
    steps.add(new Step("crop", padH, padW, 0, null, null));
    return this;
  }

  /** A horizontal flip with probability {@code p}. */
  public Augment flip(double p) {
    steps.add(new Step("flip", 0, 0, p, null, null));
    return this;
  }

  /** {@code (x - mean[c]) / std[c]} for every channel c, in float32. */
  public Augment normalize(float[] mean, float[] std) {
    steps.add(new Step("normalize", 0, 0, 0, mean.clone(), std.clone()));
    return this;
  }

  /**
   * Augments the images in {@code x} ({@code [n, C, H, W]}) in place; sample k is at position
   * {@code first + k} of the run. {@code train}: all steps; otherwise the normalisation only.
   */
  public void apply(Buf x, long first, long seed, boolean train) {
    int n = x.shape[0];
    int c = x.shape[1];
    int h = x.shape[2];
    int w = x.shape[3];
    int plane = h * w;
    float[] scratch = new float[c * plane];
    for (int k = 0; k < n; k++) {
      int at = x.off + k * c * plane;
      Rng rng = train ? new Rng(Rng.streamSeed("augment/" + (first + k), seed)) : null;
      for (Step s : steps) {
        switch (s.kind()) {
          case "normalize" -> {
            for (int ch = 0; ch < c; ch++) {
              float m = s.mean()[ch];
              float d = s.std()[ch];
              for (int i = at + ch * plane; i < at + (ch + 1) * plane; i++) {
                x.a[i] = (x.a[i] - m) / d;
              }
            }
          }
          case "crop" -> {
            if (!train) {
              continue;
            }
            int dy = (int) Long.remainderUnsigned(rng.next(), 2L * s.padH() + 1);
            int dx = (int) Long.remainderUnsigned(rng.next(), 2L * s.padW() + 1);
            // output (i, j) reads input (i + dy - ph, j + dx - pw), zero outside the image
            for (int ch = 0; ch < c; ch++) {
              for (int i = 0; i < h; i++) {
                int si = i + dy - s.padH();
                for (int j = 0; j < w; j++) {
                  int sj = j + dx - s.padW();
                  boolean inside = si >= 0 && si < h && sj >= 0 && sj < w;
                  scratch[ch * plane + i * w + j] = inside ? x.a[at + ch * plane + si * w + sj] : 0f;
                }
              }
            }
            System.arraycopy(scratch, 0, x.a, at, c * plane);
          }
          default -> { // flip
            if (!train) {
              continue;
            }
            double u = (rng.next() >>> 40) * 0x1.0p-24;
            if (u < s.p()) {
              for (int row = at; row < at + c * plane; row += w) {
                for (int j = 0; j < w / 2; j++) {
                  float t = x.a[row + j];
                  x.a[row + j] = x.a[row + w - 1 - j];
                  x.a[row + w - 1 - j] = t;
                }
              }
            }
          }
        }
      }
    }
  }
}
