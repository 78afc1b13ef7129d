package deepdsl.runtime;

/**
 * The test phase's metrics, accumulated batch by batch as the Python trainer's {@code measure}
 * computes them: the mean loss; where the loss classifies a label, the top-1 and (more than 5
 * classes) top-5 accuracy, a sample counting for top-k when fewer than k classes rank before its
 * label (by score, then by class id, so top-1 is argmax's; a NaN or infinite score is wrong); where
 * the loss regresses {@code predict} on an input, the mean absolute error over every element.
 */
final class Metrics {
  private double lossSum;
  private int batches;
  private long samples;
  private long correct;
  private long top5;
  private int classes;
  private double absSum;
  private long elements;

  void loss(double loss) {
    lossSum += loss;
    batches++;
  }

  /** Scores {@code [n, K]} against the class ids in {@code labels} ({@code [n]}). */
  void classes(Buf scores, Buf labels) {
    int n = labels.shape[0];
    int k = scores.shape[1];
    classes = k;
    for (int i = 0; i < n; i++) {
      int label = (int) labels.a[labels.off + i];
      float mine = scores.a[scores.off + i * k + label];
      boolean finite = true;
      int rank = 0;
      for (int j = 0; j < k; j++) {
        float score = scores.a[scores.off + i * k + j];
        finite &= Float.isFinite(score);
        rank += score > mine || (score == mine && j < label) ? 1 : 0;
      }
      correct += finite && rank < 1 ? 1 : 0;
      top5 += finite && rank < 5 ? 1 : 0;
    }
    samples += n;
  }

  /** Predictions against the regression target {@code t}, element by element. */
  void regression(Buf predict, Buf t) {
    for (int e = 0; e < t.numel(); e++) {
      absSum += Math.abs((double) predict.a[predict.off + e] - (double) t.a[t.off + e]);
    }
    elements += t.numel();
  }

  /** {@code {loss, accuracy, top5, mae}}, NaN where not reported. */
  double[] result() {
    double accuracy = samples == 0 ? Double.NaN : (double) correct / samples;
    double topFive = samples == 0 || classes <= 5 ? Double.NaN : (double) top5 / samples;
    double mae = elements == 0 ? Double.NaN : absSum / elements;
    return new double[] {lossSum / Math.max(1, batches), accuracy, topFive, mae};
  }
}
