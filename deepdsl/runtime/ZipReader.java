package deepdsl.runtime;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.zip.CRC32;
import java.util.zip.DataFormatException;
import java.util.zip.Inflater;

/**
 * The ZIP container of an {@code .npz} archive, read by the steps and rules of {@code
 * deepdsl/npzfile/} (docs/formats.md, "Reading an .npz archive"; {@link Npz#read} lists them):
 * the end record and central directory, each entry's record checked before anything is allocated,
 * its local header, and its bytes stored or inflated with their CRC-32 checked. What an entry holds
 * is {@link Npy}'s to read.
 */
final class ZipReader {
  private ZipReader() {}

  static final int CHUNK = 1 << 16;
  static final long MAX_ENTRY_BYTES = 1L << 32; // an entry this large or larger is refused
  static final long MAX_INFLATE_RATIO = 16; // deflated entries promise at most 16 x ...
  static final long MIN_INFLATE_LIMIT = 64L << 20; // ... the archive's size, or 64 MiB
  static final long MAX_DIRECTORY_BYTES = 16L << 20;
  static final int ENCRYPTED = 0x1;
  static final int PATCHED = 0x20;
  static final int STRONG = 0x40;
  static final int UTF8 = 0x800;
  /** The most bytes the deflated entries of an archive of {@code bytes} bytes may promise. */
  static long inflateLimit(long bytes) {
    return Math.max(MAX_INFLATE_RATIO * bytes, MIN_INFLATE_LIMIT);
  }

  /** One central directory record: the entry's name, flags, method, CRC, sizes and offset. */
  record ZipRecord(
      String name, byte[] rawName, int flags, int method, long crc, long packed, long size,
      long offset) {}

  /** The central directory: where it starts and its records. */
  record Directory(long start, List<ZipRecord> entries) {}

  static String arrayName(String entry) {
    return entry.endsWith(".npy") ? entry.substring(0, entry.length() - 4) : entry;
  }

  static long u(byte[] b, int at, int n) {
    long v = 0;
    for (int k = n - 1; k >= 0; k--) {
      v = v << 8 | (b[at + k] & 0xFF);
    }
    return v;
  }

  static boolean startsWith(byte[] b, int at, int c, int d) {
    return at >= 0 && at + 4 <= b.length && b[at] == 'P' && b[at + 1] == 'K' && b[at + 2] == c
        && b[at + 3] == d;
  }

  /** {@code n} bytes at {@code position} (fewer where the file ends). */
  static byte[] readAt(FileChannel channel, long position, int n) throws IOException {
    ByteBuffer b = ByteBuffer.allocate(Math.max(0, n));
    while (b.hasRemaining()) {
      int k = channel.read(b, position + b.position());
      if (k < 0) {
        break;
      }
    }
    return Arrays.copyOf(b.array(), b.position());
  }

  /**
   * The central directory, after the end record's checks: the last end record of the file's last
   * 65,557 bytes ends exactly at the file's end (its ZIP64 record used where the 76 bytes before it
   * are one), one disk, the directory ending where that record begins and holding the entries it
   * counts, its records and extra fields whole.
   */
  static Directory directory(FileChannel channel, long size, String file)
      throws IOException {
    int tailSize = (int) Math.min(size, 22 + 65535);
    byte[] tail = readAt(channel, size - tailSize, tailSize);
    int at = tail.length - 22;
    while (at >= 0 && !startsWith(tail, at, 5, 6)) {
      at--;
    }
    if (at < 0) {
      throw new IOException(file + " is not an .npz archive (no ZIP end record)");
    }
    long end = at + 22 + u(tail, at + 20, 2);
    if (end < tail.length) {
      throw new IOException(
          file + ": " + (tail.length - end) + " bytes of other data after the archive's end");
    }
    if (end > tail.length) {
      throw new IOException(
          file
              + " is not an .npz archive (its end record's comment runs past the end of the"
              + " file)");
    }
    long record = size - tailSize + at;
    long disk = u(tail, at + 4, 2);
    long cdDisk = u(tail, at + 6, 2);
    long countHere = u(tail, at + 8, 2);
    long count = u(tail, at + 10, 2);
    long cdSize = u(tail, at + 12, 4);
    long cdOffset = u(tail, at + 16, 4);
    long before = record;
    if (record >= 20 + 56) {
      byte[] locator = readAt(channel, record - 20, 20);
      byte[] z64 = readAt(channel, record - 20 - 56, 56);
      if (startsWith(locator, 0, 6, 7) && startsWith(z64, 0, 6, 6)) {
        if (u(locator, 4, 4) != 0 || u(locator, 16, 4) > 1) {
          throw new IOException(file + ": an archive that spans several disks is not read");
        }
        disk = u(z64, 16, 4);
        cdDisk = u(z64, 20, 4);
        countHere = u(z64, 24, 8);
        count = u(z64, 32, 8);
        cdSize = u(z64, 40, 8);
        cdOffset = u(z64, 48, 8);
        before = record - 20 - 56;
      }
    }
    if (disk != 0 || cdDisk != 0 || countHere != count) {
      throw new IOException(file + ": an archive that spans several disks is not read");
    }
    // (unsigned: a ZIP64 size or offset of 2^63 or more is negative here, and refused)
    if (cdOffset < 0 || cdSize < 0 || cdOffset + cdSize != before) {
      throw new IOException(
          String.format(
              "%s: damaged ZIP archive: its central directory (%s bytes at %s) does not end"
                  + " where its end record begins (%d); data before or inside the archive is not"
                  + " read",
              file, Long.toUnsignedString(cdSize), Long.toUnsignedString(cdOffset), before));
    }
    if (cdSize > MAX_DIRECTORY_BYTES) {
      throw new IOException(
          String.format(
              "%s: its central directory of %d bytes is larger than deepdsl reads (%d)",
              file, cdSize, MAX_DIRECTORY_BYTES));
    }
    byte[] cd = readAt(channel, cdOffset, (int) cdSize);
    List<ZipRecord> entries = new ArrayList<>();
    int pos = 0;
    while (pos < cd.length) {
      if (cd.length - pos < 46 || !startsWith(cd, pos, 1, 2)) {
        throw new IOException(
            file + ": damaged ZIP archive: a bad central directory record at " + (cdOffset + pos));
      }
      int flags = (int) u(cd, pos + 8, 2);
      int method = (int) u(cd, pos + 10, 2);
      long crc = u(cd, pos + 16, 4);
      long packed = u(cd, pos + 20, 4);
      long unpacked = u(cd, pos + 24, 4);
      int n = (int) u(cd, pos + 28, 2);
      int m = (int) u(cd, pos + 30, 2);
      int k = (int) u(cd, pos + 32, 2);
      long offset = u(cd, pos + 42, 4);
      if ((long) pos + 46 + n + m + k > cd.length) {
        throw new IOException(
            file + ": damaged ZIP archive: a central directory record at " + (cdOffset + pos)
                + " runs past its end");
      }
      byte[] raw = Arrays.copyOfRange(cd, pos + 46, pos + 46 + n);
      String name =
          entryName(raw, flags, file + ": the central directory record at " + (cdOffset + pos));
      // the sizes and offset from the first ZIP64 extra field where the record holds 0xFFFFFFFF
      long[] values = {unpacked, packed, offset};
      boolean seen = false;
      int x = pos + 46 + n;
      int xEnd = x + m;
      while (xEnd - x >= 4) {
        int kind = (int) u(cd, x, 2);
        int len = (int) u(cd, x + 2, 2);
        if (4 + len > xEnd - x) {
          throw new IOException(
              file
                  + ", entry '"
                  + name
                  + "': damaged ZIP data (an extra field runs past its record)");
        }
        if (kind == 1 && !seen) {
          seen = true;
          int d = x + 4;
          for (int i = 0; i < 3; i++) {
            if (values[i] == 0xFFFFFFFFL) {
              if (x + 4 + len - d < 8) {
                throw new IOException(
                    file
                        + ", entry '"
                        + name
                        + "': damaged ZIP data (a ZIP64 extra field too short)");
              }
              values[i] = u(cd, d, 8);
              d += 8;
            }
          }
        }
        x += 4 + len;
      }
      entries.add(new ZipRecord(name, raw, flags, method, crc, values[1], values[0], values[2]));
      pos += 46 + n + m + k;
    }
    if (entries.size() != count) {
      throw new IOException(
          String.format(
              "%s: damaged ZIP archive: its end record counts %s entries, its central directory"
                  + " holds %d",
              file, Long.toUnsignedString(count), entries.size()));
    }
    return new Directory(cdOffset, entries);
  }

  /** An entry name: UTF-8 where flagged so, else ASCII; never holding a NUL. */
  static String entryName(byte[] raw, int flags, String where) throws IOException {
    boolean ascii = true;
    for (byte b : raw) {
      if (b == 0) {
        throw new IOException(where + ": an entry name holding a NUL byte");
      }
      ascii &= b >= 0;
    }
    if ((flags & UTF8) != 0) {
      try {
        return StandardCharsets.UTF_8
            .newDecoder()
            .onMalformedInput(CodingErrorAction.REPORT)
            .onUnmappableCharacter(CodingErrorAction.REPORT)
            .decode(ByteBuffer.wrap(raw))
            .toString();
      } catch (CharacterCodingException e) {
        throw new IOException(where + ": an entry name flagged UTF-8 that is not UTF-8", e);
      }
    }
    if (!ascii) {
      throw new IOException(
          where + ": an entry name of other than ASCII characters without the UTF-8 flag");
    }
    return new String(raw, StandardCharsets.US_ASCII);
  }

  /** Every entry's record against the rules, before anything is read. */
  static void checkEntries(
      List<ZipRecord> entries, long archive, long directory, String file)
      throws IOException {
    Set<String> names = new HashSet<>();
    List<long[]> regions = new ArrayList<>();
    long inflated = 0;
    for (int i = 0; i < entries.size(); i++) {
      ZipRecord e = entries.get(i);
      String where = file + ", entry '" + e.name() + "'";
      if ((e.flags() & (ENCRYPTED | STRONG)) != 0) {
        throw new IOException(where + " is encrypted; encrypted entries are not read");
      }
      if ((e.flags() & PATCHED) != 0) {
        throw new IOException(where + " holds patch data; it is not read");
      }
      if (e.method() != 0 && e.method() != 8) {
        String known =
            switch (e.method()) {
              case 12 -> " (bzip2)";
              case 14 -> " (LZMA)";
              case 9 -> " (deflate64)";
              case 93 -> " (Zstandard)";
              case 95 -> " (XZ)";
              case 98 -> " (PPMd)";
              default -> "";
            };
        throw new IOException(
            where + " uses compression method " + e.method() + known
                + "; only stored (0) and deflate (8) entries are read");
      }
      String name = arrayName(e.name());
      if (!e.name().endsWith("/") && !names.add(name)) {
        throw new IOException(where + ": the array '" + name + "' appears twice");
      }
      if (e.size() < 0 || e.size() >= MAX_ENTRY_BYTES) {
        throw new IOException(
            where + " is " + Long.toUnsignedString(e.size())
                + " bytes; entries of 4 GiB or more are not read");
      }
      if (e.method() == 0 && e.packed() != e.size()) {
        throw new IOException(
            where + ": a stored entry of " + e.size() + " bytes that takes "
                + Long.toUnsignedString(e.packed()));
      }
      if (e.method() == 8) {
        inflated += e.size();
        if (inflated > inflateLimit(archive)) {
          throw new IOException(
              String.format(
                  "%s: the deflated entries promise %d bytes or more in all, more than deepdsl"
                      + " inflates from an archive of %d bytes (%d times its size, at least %d"
                      + " MiB)",
                  where, inflated, archive, MAX_INFLATE_RATIO, MIN_INFLATE_LIMIT >> 20));
        }
      }
      // (an offset or compressed size of 2^63 or more saturates: it lies outside the archive; at
      // the least: the local header's extra field adds to the end)
      long end;
      try {
        end = Math.addExact(Math.addExact(e.offset(), 30 + e.rawName().length), e.packed());
      } catch (ArithmeticException overflow) {
        end = Long.MAX_VALUE;
      }
      end = e.offset() < 0 || e.packed() < 0 ? Long.MAX_VALUE : end;
      if (end > directory) {
        throw new IOException(
            where
                + ": damaged ZIP data (its data runs past the entries into the central directory)");
      }
      regions.add(new long[] {e.offset() < 0 ? Long.MAX_VALUE : e.offset(), end, i});
    }
    regions.sort((a, b) -> Long.compareUnsigned(a[0], b[0]));
    for (int k = 0; k + 1 < regions.size(); k++) {
      if (Long.compareUnsigned(regions.get(k)[1], regions.get(k + 1)[0]) > 0) {
        throw new IOException(
            String.format(
                "%s, entry '%s' overlaps entry '%s' (damaged or crafted ZIP data)",
                file,
                entries.get((int) regions.get(k + 1)[2]).name(),
                entries.get((int) regions.get(k)[2]).name()));
      }
    }
  }

  /** One entry's bytes, once its local header is checked against its record. */
  static EntryStream open(FileChannel channel, ZipRecord e, long directory, String file)
      throws IOException {
    String where = file + ", entry '" + e.name() + "'";
    byte[] head = readAt(channel, e.offset(), 30);
    if (head.length < 30 || !startsWith(head, 0, 3, 4)) {
      throw new IOException(
          where + ": damaged ZIP data (no local header at " + Long.toUnsignedString(e.offset())
              + ")");
    }
    int n = (int) u(head, 26, 2);
    int m = (int) u(head, 28, 2);
    byte[] local = readAt(channel, e.offset() + 30, n);
    boolean ascii = true;
    for (byte b : local) {
      ascii &= b >= 0;
    }
    if (!Arrays.equals(local, e.rawName()) || (!ascii && (u(head, 6, 2) & UTF8) == 0)) {
      throw new IOException(
          where + ": damaged ZIP data (its local header names '"
              + new String(local, StandardCharsets.ISO_8859_1) + "')");
    }
    long start = e.offset() + 30 + n + m;
    if (start + e.packed() > directory) {
      throw new IOException(
          where + ": damaged ZIP data (its data runs past the entries into the central directory)");
    }
    return new EntryStream(channel, start, e, where);
  }

  /**
   * An entry's bytes: at most its size, read or inflated chunk by chunk, its CRC-32 checked at the
   * end.
   */
  static final class EntryStream {
    private final FileChannel channel;
    final String where;
    private final long expected;
    private final Inflater inflater;
    private final CRC32 crc = new CRC32();
    private long position;
    private long leftIn;
    private long leftOut;

    EntryStream(FileChannel channel, long start, ZipRecord e, String where) {
      this.channel = channel;
      this.position = start;
      this.leftIn = e.packed();
      this.leftOut = e.size();
      this.where = where;
      this.expected = e.crc();
      this.inflater = e.method() == 8 ? new Inflater(true) : null;
    }

    private byte[] more(long n) throws IOException {
      int k = (int) Math.min(leftIn, n);
      byte[] data = readAt(channel, position, k);
      if (data.length < k) {
        throw new IOException(where + ": truncated (the archive ends inside it)");
      }
      position += k;
      leftIn -= k;
      return data;
    }

    /** Up to {@code n} more bytes (fewer only at the entry's end, or where its data ends early). */
    byte[] read(int n) throws IOException {
      n = (int) Math.min(n, leftOut);
      byte[] out = new byte[n];
      int got = 0;
      try {
        while (got < n) {
          if (inflater == null) {
            if (leftIn == 0) {
              break;
            }
            byte[] chunk = more(n - got);
            System.arraycopy(chunk, 0, out, got, chunk.length);
            got += chunk.length;
          } else {
            if (inflater.needsInput()) {
              if (inflater.finished() || leftIn == 0) {
                break;
              }
              inflater.setInput(more(CHUNK));
            }
            got += inflater.inflate(out, got, n - got);
            if (inflater.finished()) {
              break;
            }
            if (inflater.needsDictionary()) {
              throw new IOException(where + ": damaged ZIP data (a preset dictionary)");
            }
          }
        }
      } catch (DataFormatException e) {
        throw new IOException(where + ": damaged ZIP data (" + e.getMessage() + ")", e);
      }
      out = got == n ? out : Arrays.copyOf(out, got);
      leftOut -= got;
      crc.update(out);
      return out;
    }

    void finish() throws IOException {
      if (inflater != null) {
        inflater.end();
      }
      if (crc.getValue() != expected) {
        throw new IOException(
            String.format(
                "%s: damaged ZIP data (its CRC-32 is %08x, the archive records %08x)",
                where, crc.getValue(), expected));
      }
    }
  }
}
