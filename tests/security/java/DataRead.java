import deepdsl.runtime.Data;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

/**
 * Test driver for tests/security/test_readers.py: loads every data source a list file names, one a
 * line ({@code FLAG} for images of {@code [1, 28, 28]} or {@code [3, 32, 32]} and 10 classes, or
 * {@code FLAG TOKENS VOCAB} for text), in this one JVM, and writes one line per source: {@code OK}
 * and the training and test sizes, or {@code ERR} and the IOException's message. Anything else (an
 * OutOfMemoryError under the test's small heap) ends the run with a stack trace.
 */
public final class DataRead {
  public static void main(String[] args) throws IOException {
    StringBuilder out = new StringBuilder();
    for (String line : Files.readAllLines(Path.of(args[0]), StandardCharsets.UTF_8)) {
      if (line.isEmpty()) {
        continue;
      }
      String[] f = line.split("\t");
      try {
        Data.Spec spec = Data.parseFlag(f[0]);
        Data d;
        if (f.length == 3) {
          int t = Integer.parseInt(f[1]);
          int vocab = Integer.parseInt(f[2]);
          d =
              Data.load(
                  spec,
                  List.of(
                      new Data.Field("t", false, vocab, new int[] {t}),
                      new Data.Field("n", true, vocab, new int[] {t})),
                  1);
        } else {
          int[] shape = spec.kind().equals("mnist") ? new int[] {1, 28, 28} : new int[] {3, 32, 32};
          d = Data.load(spec, shape, 10, 1);
        }
        out.append("OK\t").append(d.size()).append(' ').append(d.testSize());
      } catch (IOException e) {
        out.append("ERR\t").append(String.valueOf(e.getMessage()).replace('\n', ' ').replace('\t', ' '));
      }
      out.append('\n');
    }
    Files.writeString(Path.of(args[1]), out, StandardCharsets.UTF_8);
  }
}
