import deepdsl.runtime.Npz;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.zip.CRC32;

/**
 * Test driver for tests/security/test_readers.py: reads every archive a list file names (one path a
 * line) with {@link Npz#read} in this one JVM, and writes one line per archive to the output file:
 * {@code OK} and, for each array, {@code name kind shape crc} (kind f for floats, i for integers;
 * crc the CRC-32 of its elements as little-endian float32 or int64, NaN made canonical), or {@code
 * ERR} and the IOException's message. Anything but an IOException (an OutOfMemoryError under the
 * test's small heap) ends the run with a stack trace.
 */
public final class NpzRead {
  public static void main(String[] args) throws IOException {
    List<String> paths = Files.readAllLines(Path.of(args[0]), StandardCharsets.UTF_8);
    StringBuilder out = new StringBuilder();
    for (String path : paths) {
      if (path.isEmpty()) {
        continue;
      }
      try {
        StringBuilder line = new StringBuilder("OK");
        for (Map.Entry<String, Npz.Array> e : Npz.read(Path.of(path)).entrySet()) {
          Npz.Array a = e.getValue();
          line.append('\t').append(e.getKey()).append(' ').append(a.isFloat() ? 'f' : 'i');
          line.append(' ').append(Arrays.toString(a.shape).replace(" ", ""));
          line.append(' ').append(Long.toHexString(crc(a)));
        }
        out.append(line);
      } catch (IOException e) {
        out.append("ERR\t").append(String.valueOf(e.getMessage()).replace('\n', ' ').replace('\t', ' '));
      }
      out.append('\n');
    }
    Files.writeString(Path.of(args[1]), out, StandardCharsets.UTF_8);
  }

  private static long crc(Npz.Array a) {
    CRC32 crc = new CRC32();
    int n = a.numel();
    ByteBuffer b = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN);
    for (int k = 0; k < n; k++) {
      b.clear();
      if (a.isFloat()) {
        b.putInt(Float.floatToIntBits(a.floats[k]));
      } else {
        b.putLong(a.longs[k]);
      }
      crc.update(b.array(), 0, b.position());
    }
    return crc.getValue();
  }
}
