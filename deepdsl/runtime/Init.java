package deepdsl.runtime;

import java.util.Arrays;

/**
 * Parameter initialisation, bit-identical to {@code init_array} of {@code deepdsl/initializers.py}.
 *
 * <p>Element i (row-major) of parameter {@code name} is drawn from the stream {@code
 * Rng.streamSeed(name, seed)}, computed in double and rounded once to float:
 *
 * <ul>
 *   <li>{@code he()}: {@code normal_i * sqrt(2 / fanIn)}
 *   <li>{@code xavier()}: {@code a * (2 * u_i - 1)} with {@code a = sqrt(6 / (fanIn + fanOut))}
 *   <li>{@code gaussian(std)}: {@code normal_i * std}
 *   <li>{@code uniform(a)}: {@code a * (2 * u_i - 1)}
 *   <li>{@code constant(v)}: {@code v} (draws nothing)
 * </ul>
 */
public final class Init {
  private Init() {}

  /**
   * The initial value of parameter {@code name} of {@code shape}, row-major.
   *
   * @param kind one of he, xavier, gaussian, uniform, constant
   * @param args the initialiser's arguments (none for he and xavier, one for the others)
   * @param fanIn the fan-in (he, xavier)
   * @param fanOut the fan-out (xavier)
   * @param seed the program's seed
   * @throws IllegalArgumentException for an unknown kind, a wrong number of arguments, a negative
   *     dimension or fans the kind cannot use
   */
  public static float[] array(
      String name, int[] shape, String kind, double[] args, int fanIn, int fanOut, long seed) {
    int arity = arity(kind, name);
    if (args.length != arity) {
      throw new IllegalArgumentException(
          String.format(
              "initialiser %s() for parameter '%s' takes %d argument(s), got %d",
              kind, name, arity, args.length));
    }
    long count = 1;
    for (int d : shape) {
      if (d < 0) {
        throw new IllegalArgumentException(
            "parameter '" + name + "' has a negative dimension in shape " + Arrays.toString(shape));
      }
      count *= d;
    }
    if (count > Integer.MAX_VALUE - 8) {
      throw new IllegalArgumentException(
          String.format(
              "parameter '%s' of shape %s is too large for one Java array",
              name, Arrays.toString(shape)));
    }
    float[] out = new float[(int) count];
    Rng rng = new Rng(Rng.streamSeed(name, seed));
    switch (kind) {
      case "constant" -> Arrays.fill(out, (float) args[0]);
      case "he" -> {
        if (fanIn <= 0) {
          throw new IllegalArgumentException(
              "he() for parameter '" + name + "' needs a positive fan_in, got " + fanIn);
        }
        fillNormal(out, rng, Math.sqrt(2.0 / fanIn));
      }
      case "gaussian" -> fillNormal(out, rng, args[0]);
      case "xavier" -> {
        if (fanIn + fanOut <= 0) {
          throw new IllegalArgumentException(
              String.format(
                  "xavier() for parameter '%s' needs fan_in + fan_out > 0, got %d + %d",
                  name, fanIn, fanOut));
        }
        fillUniform(out, rng, Math.sqrt(6.0 / (fanIn + fanOut)));
      }
      default -> fillUniform(out, rng, args[0]); // uniform(a); arity() rejected every other kind
    }
    return out;
  }

  private static int arity(String kind, String name) {
    return switch (kind) {
      case "he", "xavier" -> 0;
      case "gaussian", "uniform", "constant" -> 1;
      default ->
          throw new IllegalArgumentException(
              String.format(
                  "unknown initialiser '%s' for parameter '%s' (known: he(), xavier(), gaussian(),"
                      + " uniform(), constant())",
                  kind, name));
    };
  }

  private static void fillNormal(float[] out, Rng rng, double scale) {
    for (int i = 0; i < out.length; i++) {
      out[i] = (float) (rng.normal() * scale);
    }
  }

  /** {@code a * (2 u - 1)} per element. */
  private static void fillUniform(float[] out, Rng rng, double a) {
    for (int i = 0; i < out.length; i++) {
      out[i] = (float) (a * (2.0 * rng.uniform() - 1.0));
    }
  }
}
