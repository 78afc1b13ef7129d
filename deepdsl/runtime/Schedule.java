package deepdsl.runtime;

/**
 * A learning-rate schedule, as {@code deepdsl/frontend/program.py}'s {@code Schedule}: the rate of
 * iteration k = 0, 1, ... (the step counter, so a resumed run continues its schedule), in double,
 * every operation in the Python side's order. The step takes it rounded to float.
 */
public abstract class Schedule {
  /** The rate of iteration {@code k}. */
  public abstract double at(long k);

  /** The same schedule from another base rate (the innermost constant): what {@code --lr} sets. */
  public abstract Schedule withBase(double base);

  /** {@code value} at every iteration. */
  public static Schedule constant(double value) {
    return new Schedule() {
      @Override
      public double at(long k) {
        return value;
      }

      @Override
      public Schedule withBase(double other) {
        return constant(other);
      }
    };
  }

  /** {@code base(k) * gamma^(k / every)} (PyTorch's StepLR). */
  public static Schedule step(Schedule base, long every, double gamma) {
    return new Schedule() {
      @Override
      public double at(long k) {
        return base.at(k) * power(gamma, k / every);
      }

      @Override
      public Schedule withBase(double other) {
        return step(base.withBase(other), every, gamma);
      }
    };
  }

  /**
   * {@code min + (base(k) - min) * (1 + cos(pi*k/total)) / 2} for k < total, then {@code min}
   * (PyTorch's CosineAnnealingLR over one half period).
   */
  public static Schedule cosine(Schedule base, long total, double min) {
    return new Schedule() {
      @Override
      public double at(long k) {
        if (k >= total) {
          return min;
        }
        return min + (base.at(k) - min) * (1.0 + StrictMath.cos(Math.PI * k / total)) / 2.0;
      }

      @Override
      public Schedule withBase(double other) {
        return cosine(base.withBase(other), total, min);
      }
    };
  }

  /**
   * {@code base(0) * (k+1)/steps} for k < steps, then {@code base(k - steps)} (LinearLR, then the
   * base schedule from its own start, as PyTorch's SequentialLR runs them).
   */
  public static Schedule warmup(Schedule base, long steps) {
    return new Schedule() {
      @Override
      public double at(long k) {
        return k < steps ? base.at(0) * (k + 1) / steps : base.at(k - steps);
      }

      @Override
      public Schedule withBase(double other) {
        return warmup(base.withBase(other), steps);
      }
    };
  }

  /** x^n by squaring: the multiplications of the Python side's {@code power}, in its order. */
  static double power(double x, long n) {
    double result = 1.0;
    while (n > 0) {
      if ((n & 1) == 1) {
        result *= x;
      }
      x *= x;
      n >>= 1;
    }
    return result;
  }
}
