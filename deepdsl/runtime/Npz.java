package deepdsl.runtime;

import java.io.BufferedOutputStream;
import java.io.IOException;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.Channels;
import java.nio.channels.FileChannel;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.nio.file.attribute.PosixFilePermission;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Predicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.zip.CRC32;
import java.util.zip.DataFormatException;
import java.util.zip.Inflater;
import java.util.zip.ZipEntry;
import java.util.zip.ZipOutputStream;

/**
 * NumPy {@code .npz} archives (docs/formats.md): what {@code np.savez} and {@code deepdsl/checkpoint.py}
 * write.
 *
 * <p>An archive is a ZIP with one {@code NAME.npy} entry per array, in insertion order; a name may
 * hold dots and slashes ({@code cv1.W}, {@code opt/cv1.W/momentum}, {@code opt/step}). Writing
 * stores the entries uncompressed; reading accepts stored and deflated entries (as {@code
 * np.savez_compressed} writes them) by the rules of {@link #read}, and {@code .npy} format
 * versions 1.0, 2.0 and 3.0, C or Fortran order, either byte order, floats (float16/32/64, given
 * back as float32) and integers (8 to 64 bits, signed or not, given back as int64). Writing
 * produces version 1.0 entries of little-endian float32 ({@code <f4}) and int64 ({@code <i8}).
 */
public final class Npz {
  private static final byte[] MAGIC = {(byte) 0x93, 'N', 'U', 'M', 'P', 'Y'};
  private static final int CHUNK = 1 << 16;
  private static final long MAX_ENTRY_BYTES = 1L << 32; // an entry this large or larger is refused
  private static final int MAX_ELEMENTS = Integer.MAX_VALUE - 8; // the most of one Java array
  private static final String TEMP_SUFFIX = ".deepdsl-tmp";
  private static final int NAME_MAX = 255; // the longest name of a file (bytes) on Linux's file systems

  private Npz() {}

  /** One array of an archive: its shape and its row-major elements, float32 or int64. */
  public static final class Array {
    /** The dimensions; empty for a scalar. */
    public final int[] shape;

    /** The elements when the array holds floats, else null. */
    public final float[] floats;

    /** The elements when the array holds integers, else null. */
    public final long[] longs;

    private Array(int[] shape, float[] floats, long[] longs) {
      int length = floats != null ? floats.length : longs.length;
      if (count(shape) != length) {
        throw new IllegalArgumentException(
            String.format(
                "an array of shape %s holds %d elements, not %d",
                Arrays.toString(shape), count(shape), length));
      }
      this.shape = shape.clone();
      this.floats = floats;
      this.longs = longs;
    }

    /**
     * A float32 array of {@code shape} (no dimensions for a scalar) holding {@code data},
     * row-major.
     */
    public static Array ofFloats(float[] data, int... shape) {
      return new Array(shape, data, null);
    }

    /**
     * An int64 array of {@code shape} (no dimensions for a scalar) holding {@code data}, row-major.
     */
    public static Array ofLongs(long[] data, int... shape) {
      return new Array(shape, null, data);
    }

    /** Whether the array holds floats (else it holds integers). */
    public boolean isFloat() {
      return floats != null;
    }

    /** The number of elements. */
    public int numel() {
      return isFloat() ? floats.length : longs.length;
    }
  }

  /**
   * The arrays of the archive at {@code path}, by name (the entry name without {@code .npy}), in
   * file order. The ZIP container is read by the steps and rules of {@code deepdsl/npzfile.py}
   * (docs/formats.md, "Reading an .npz archive"), so both runtimes accept and refuse the same
   * files: every entry is checked from the central directory (method stored or deflate, not
   * encrypted, named once, under 4 GiB, inside the archive, the deflated ones promising at most
   * {@code max(16 x the archive's size, 64 MiB)} in all) before any array is allocated.
   *
   * @throws IOException when the file is missing, is not a ZIP archive, or holds an entry that is
   *     not a {@code .npy} array of a supported type; the message names the file and the entry
   */
  public static LinkedHashMap<String, Array> read(Path path) throws IOException {
    if (!Files.isRegularFile(path)) {
      throw new IOException("npz file not found: '" + path + "'");
    }
    String file = "npz file '" + path + "'";
    try (FileChannel channel = FileChannel.open(path, StandardOpenOption.READ)) {
      long size = channel.size();
      if (Arrays.equals(readAt(channel, 0, (int) Math.min(size, MAGIC.length)), MAGIC)) {
        throw new IOException(file + " is a single .npy array, not an .npz archive");
      }
      Directory directory = directory(channel, size, file);
      checkEntries(directory.entries(), size, directory.start(), file);
      LinkedHashMap<String, Array> out = new LinkedHashMap<>();
      for (ZipRecord e : directory.entries()) {
        if (!e.name().endsWith("/")) {
          out.put(arrayName(e.name()), readEntry(channel, e, directory.start(), file));
        }
      }
      return out;
    }
  }

  /**
   * Whether {@link #write} could write {@code path}: its folder exists and is writable, what is
   * there is a regular file or nothing, and the name leaves room for the temporary file's (a
   * program checks its --save and --predict before it works). Returns {@code path}.
   *
   * @throws IOException saying why it could not
   */
  public static Path checkWritable(Path path) throws IOException {
    return checkWritable(path, false);
  }

  /**
   * {@link #checkWritable(Path)}, where {@code replaceReadOnly} lets a read-only file be replaced
   * (the program's --replace-readonly).
   */
  public static Path checkWritable(Path path, boolean replaceReadOnly) throws IOException {
    String what = "cannot write parameter file '" + path + "'";
    Path name = path.getFileName();
    Path folder = path.toAbsolutePath().getParent();
    if (name == null || folder == null || name.toString().equals("..") || name.toString().equals(".")) {
      throw new IOException(what + ": '" + path + "' names a folder, not a file");
    }
    if (!Files.isDirectory(folder)) {
      throw new IOException(what + ": folder '" + folder + "' does not exist");
    }
    existing(path, what, replaceReadOnly);
    checkName(name.toString(), what);
    if (!Files.isWritable(folder)) {
      throw new IOException(what + ": folder '" + folder + "' is not writable");
    }
    return path;
  }

  /**
   * What is at {@code path} when it may be replaced: nothing, or a regular file that (without
   * {@code replaceReadOnly}) is not read-only for us. A symbolic link is refused, never followed
   * nor replaced; so are a directory, FIFO, device or socket.
   */
  private static void existing(Path path, String what, boolean replaceReadOnly)
      throws IOException {
    BasicFileAttributes a;
    try {
      a = Files.readAttributes(path, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
    } catch (NoSuchFileException e) {
      return;
    }
    if (a.isSymbolicLink()) {
      throw new IOException(
          what
              + ": '"
              + path
              + "' is a symbolic link; deepdsl neither writes through a link nor replaces one"
              + " (remove it, or name the file it points to)");
    }
    if (!a.isRegularFile()) {
      String kind = a.isDirectory() ? "a directory" : "a special file (a device, FIFO or socket)";
      throw new IOException(
          what + ": '" + path + "' is " + kind + "; only a regular file is replaced");
    }
    if (!replaceReadOnly) {
      int mode = writableMode(path);
      if (mode >= 0) {
        throw new IOException(
            String.format(
                "%s: '%s' is read-only (mode %04o); --replace-readonly replaces it",
                what, path, mode));
      }
    }
  }

  /**
   * -1 when the mode bits of {@code path} let this process's effective user write it, as the
   * kernel decides for a user without privileges (so root too is refused a 0444 file): the
   * owner's bit, else the group's, else the others'; otherwise the file's mode, to report. Where
   * the ids are unknown (no /proc/self/status, no unix attributes), whether the file is writable
   * by access(2) and has any write bit at all.
   */
  private static int writableMode(Path path) throws IOException {
    long[] us = ourIds();
    Map<String, Object> a = null;
    try {
      a = Files.readAttributes(path, "unix:uid,gid,mode", LinkOption.NOFOLLOW_LINKS);
    } catch (UnsupportedOperationException | IllegalArgumentException e) {
      a = null;
    }
    if (a == null || us.length < 2) {
      Set<PosixFilePermission> p = Files.getPosixFilePermissions(path, LinkOption.NOFOLLOW_LINKS);
      boolean any =
          p.contains(PosixFilePermission.OWNER_WRITE)
              || p.contains(PosixFilePermission.GROUP_WRITE)
              || p.contains(PosixFilePermission.OTHERS_WRITE);
      return any && Files.isWritable(path) ? -1 : 0;
    }
    int mode = (Integer) a.get("mode") & 07777;
    long uid = Integer.toUnsignedLong((Integer) a.get("uid"));
    long gid = Integer.toUnsignedLong((Integer) a.get("gid"));
    int bit = 02;
    if (uid == us[0]) {
      bit = 0200;
    } else {
      for (int i = 1; i < us.length; i++) {
        if (us[i] == gid) {
          bit = 020;
          break;
        }
      }
    }
    return (mode & bit) != 0 ? -1 : mode;
  }

  private static long[] ids;

  /**
   * This process's effective user id, effective group id and supplementary groups, from
   * /proc/self/status (Linux); empty where that cannot be read.
   */
  private static synchronized long[] ourIds() {
    if (ids == null) {
      long[] found = new long[0];
      try {
        long uid = -1;
        long gid = -1;
        long[] groups = new long[0];
        for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
          String[] f = line.trim().split("\\s+");
          if (f[0].equals("Uid:") && f.length > 2) {
            uid = Long.parseLong(f[2]);
          } else if (f[0].equals("Gid:") && f.length > 2) {
            gid = Long.parseLong(f[2]);
          } else if (f[0].equals("Groups:")) {
            groups = Arrays.stream(f, 1, f.length).mapToLong(Long::parseLong).toArray();
          }
        }
        if (uid >= 0 && gid >= 0) {
          found = new long[2 + groups.length];
          found[0] = uid;
          found[1] = gid;
          System.arraycopy(groups, 0, found, 2, groups.length);
        }
      } catch (IOException | RuntimeException e) {
        found = new long[0];
      }
      ids = found;
    }
    return ids;
  }

  /** The temporary file of {@code base}: {@code .BASE.PID.RANDOM.deepdsl-tmp}. */
  private static String tempName(String base, int random) {
    return String.format(
        ".%s.%d.%08x%s", base, ProcessHandle.current().pid(), random, TEMP_SUFFIX);
  }

  /**
   * A name whose temporary file's name would be longer than a file system takes (NAME_MAX, 255
   * bytes on Linux's file systems; Java cannot ask the folder) is refused before any work.
   */
  private static void checkName(String base, String what) throws IOException {
    int bytes = tempName(base, 0).getBytes(StandardCharsets.UTF_8).length;
    if (bytes > NAME_MAX) {
      throw new IOException(
          String.format(
              "%s: the name '%s' is too long: its temporary file would be %d bytes"
                  + " (.NAME.PID.RANDOM%s), over the folder's limit of %d",
              what, base, bytes, TEMP_SUFFIX, NAME_MAX));
    }
  }

  /**
   * Write {@code arrays} to {@code path} (used as given, no suffix added), entries in the map's
   * order: a temporary file in the same folder, synced, then moved over {@code path} atomically.
   * What is replaced is only ever a regular file, and never a read-only one: a symbolic link is
   * refused (neither followed nor replaced), as are a directory, FIFO or device (as
   * deepdsl/files.py does). The new file keeps the old one's permissions, or gets the umask's for
   * a new file. The temporary file is {@code .NAME.PID.RANDOM.deepdsl-tmp}; one left by a killed
   * process (its PID no longer running) is removed by the next write of the same file.
   *
   * @throws IllegalArgumentException for a name NumPy could not give back (empty, starting or
   *     ending with a slash, holding a backslash)
   * @throws IOException when the folder is missing or the file cannot be written
   */
  public static void write(Path path, LinkedHashMap<String, Array> arrays) throws IOException {
    write(path, arrays, false);
  }

  /**
   * {@link #write(Path, LinkedHashMap)}, where {@code replaceReadOnly} lets a read-only file be
   * replaced (the program's --replace-readonly); its mode is kept.
   */
  public static void write(Path path, LinkedHashMap<String, Array> arrays, boolean replaceReadOnly)
      throws IOException {
    for (String name : arrays.keySet()) {
      if (name.isEmpty() || name.startsWith("/") || name.endsWith("/") || name.contains("\\")) {
        throw new IllegalArgumentException(
            "cannot save an array under the name '" + name + "' in '" + path + "'");
      }
    }
    Path target = checkWritable(path, replaceReadOnly);
    Path folder = target.toAbsolutePath().getParent();
    Set<PosixFilePermission> mode = null;
    if (Files.exists(target, LinkOption.NOFOLLOW_LINKS)) {
      try {
        mode = Files.getPosixFilePermissions(target, LinkOption.NOFOLLOW_LINKS);
      } catch (UnsupportedOperationException e) {
        mode = null; // not a POSIX file system: the new file gets the default permissions
      }
    }
    String base = target.getFileName().toString();
    removeStaleTemps(folder, base);
    Path tmp = folder.resolve(tempName(base, new SecureRandom().nextInt()));
    try {
      // CREATE_NEW: never through a link planted under the temporary name; mode 0666 & ~umask
      try (FileChannel channel =
              FileChannel.open(
                  tmp,
                  StandardOpenOption.CREATE_NEW,
                  StandardOpenOption.WRITE,
                  LinkOption.NOFOLLOW_LINKS);
          ZipOutputStream zip =
              new ZipOutputStream(
                  new BufferedOutputStream(Channels.newOutputStream(channel), CHUNK))) {
        if (mode != null) {
          Files.setPosixFilePermissions(tmp, mode);
        }
        for (Map.Entry<String, Array> e : arrays.entrySet()) {
          writeEntry(zip, e.getKey() + ".npy", e.getValue());
        }
        zip.finish();
        zip.flush();
        channel.force(true);
      }
      // what may have been put there meanwhile; the move renames over a link, never through it
      existing(target, "cannot write parameter file '" + path + "'", replaceReadOnly);
      Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    } catch (IOException | RuntimeException e) {
      Files.deleteIfExists(tmp);
      throw e;
    }
  }

  /** Remove {@code .BASE.PID.RANDOM.deepdsl-tmp} files in {@code folder} whose process is gone. */
  private static void removeStaleTemps(Path folder, String base) {
    Pattern temp =
        Pattern.compile(
            "\\." + Pattern.quote(base) + "\\.(\\d+)\\.[0-9a-f]+" + Pattern.quote(TEMP_SUFFIX));
    try (DirectoryStream<Path> files = Files.newDirectoryStream(folder)) {
      for (Path f : files) {
        Matcher m = temp.matcher(f.getFileName().toString());
        if (!m.matches() || !Files.isRegularFile(f, LinkOption.NOFOLLOW_LINKS)) {
          continue;
        }
        long pid;
        try {
          pid = Long.parseLong(m.group(1));
        } catch (NumberFormatException e) {
          continue;
        }
        boolean running =
            pid == ProcessHandle.current().pid()
                || ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false);
        if (!running) {
          Files.deleteIfExists(f);
        }
      }
    } catch (IOException e) {
      // cleaning up is a courtesy: a folder that cannot be listed still gets the new file
    }
  }

  // ---- reading ----

  private static final long MAX_INFLATE_RATIO = 16; // deflated entries promise at most 16 x ...
  private static final long MIN_INFLATE_LIMIT = 64L << 20; // ... the archive's size, or 64 MiB
  private static final long MAX_DIRECTORY_BYTES = 16L << 20;
  private static final int ENCRYPTED = 0x1;
  private static final int PATCHED = 0x20;
  private static final int STRONG = 0x40;
  private static final int UTF8 = 0x800;
  private static final String[] KEYS = {"descr", "fortran_order", "shape"};

  /** The most bytes the deflated entries of an archive of {@code bytes} bytes may promise. */
  static long inflateLimit(long bytes) {
    return Math.max(MAX_INFLATE_RATIO * bytes, MIN_INFLATE_LIMIT);
  }

  /** One central directory record: the entry's name, flags, method, CRC, sizes and offset. */
  private record ZipRecord(
      String name, byte[] rawName, int flags, int method, long crc, long packed, long size,
      long offset) {}

  /** The central directory: where it starts and its records. */
  private record Directory(long start, List<ZipRecord> entries) {}

  private static String arrayName(String entry) {
    return entry.endsWith(".npy") ? entry.substring(0, entry.length() - 4) : entry;
  }

  private static long u(byte[] b, int at, int n) {
    long v = 0;
    for (int k = n - 1; k >= 0; k--) {
      v = v << 8 | (b[at + k] & 0xFF);
    }
    return v;
  }

  private static boolean startsWith(byte[] b, int at, int c, int d) {
    return at >= 0 && at + 4 <= b.length && b[at] == 'P' && b[at + 1] == 'K' && b[at + 2] == c
        && b[at + 3] == d;
  }

  /** {@code n} bytes at {@code position} (fewer where the file ends). */
  private static byte[] readAt(FileChannel channel, long position, int n) throws IOException {
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
  private static Directory directory(FileChannel channel, long size, String file)
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
  private static String entryName(byte[] raw, int flags, String where) throws IOException {
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
  private static void checkEntries(
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

  /** One entry's array: its local header checked against its record, then its bytes. */
  private static Array readEntry(FileChannel channel, ZipRecord e, long directory, String file)
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
    EntryStream in = new EntryStream(channel, start, e, where);
    Array array = readNpy(in, e.size(), where);
    in.finish();
    return array;
  }

  /**
   * An entry's bytes: at most its size, read or inflated chunk by chunk, its CRC-32 checked at the
   * end.
   */
  private static final class EntryStream {
    private final FileChannel channel;
    private final String where;
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

  private static Array readNpy(EntryStream in, long size, String where) throws IOException {
    Header h = readHeader(in, where);
    String header = h.text();
    Object[] fields = parseHeader(header, where);
    Dtype dtype = Dtype.parse((String) fields[0], where);
    boolean columnMajor = (Boolean) fields[1];
    int[] shape = (int[]) fields[2];
    BigInteger elements = BigInteger.ONE;
    for (int d : shape) {
      elements = elements.multiply(BigInteger.valueOf(d));
    }
    if (elements.compareTo(BigInteger.valueOf(MAX_ELEMENTS)) > 0) {
      throw new IOException(
          String.format(
              "%s: shape %s holds %s elements, more than one array may (%d)",
              where, Arrays.toString(shape), elements, MAX_ELEMENTS));
    }
    int count = elements.intValue();
    String what = count + " elements of " + dtype.descr() + " " + Arrays.toString(shape);
    // before allocating: the entry holds exactly what its header promises (a header claiming 1e9
    // elements in a small entry costs nothing)
    long dataBytes = size - h.bytes();
    if (dataBytes < (long) count * dtype.size()) {
      throw new IOException(where + ": truncated (it ends inside " + what + ")");
    }
    if (dataBytes > (long) count * dtype.size()) {
      throw new IOException(where + ": more data than its header's " + what);
    }
    float[] floats = dtype.isFloat() ? new float[count] : null;
    long[] longs = dtype.isFloat() ? null : new long[count];
    int perChunk = CHUNK / dtype.size();
    for (int lo = 0; lo < count; lo += perChunk) {
      int n = Math.min(perChunk, count - lo);
      ByteBuffer data =
          ByteBuffer.wrap(readBytes(in, n * dtype.size(), where, what)).order(dtype.order());
      for (int i = lo; i < lo + n; i++) {
        if (floats != null) {
          floats[i] = dtype.readFloat(data);
        } else {
          longs[i] = dtype.readLong(data, where);
        }
      }
    }
    if (columnMajor && shape.length > 1) { // (one copy beside the array, no index of its size)
      if (floats != null) {
        float[] src = floats.clone();
        float[] dst = floats;
        fromColumnMajor(shape, (i, from) -> dst[i] = src[from]);
      } else {
        long[] src = longs.clone();
        long[] dst = longs;
        fromColumnMajor(shape, (i, from) -> dst[i] = src[from]);
      }
    }
    return new Array(shape, floats, longs);
  }

  /** The header of a {@code .npy} stream: its text, and its size with the magic bytes. */
  private record Header(String text, long bytes) {}

  /** The header of a {@code .npy} stream, which is left at the first data byte. */
  private static Header readHeader(EntryStream in, String where) throws IOException {
    byte[] prefix = in.read(8);
    if (prefix.length < 8 || !Arrays.equals(Arrays.copyOf(prefix, 6), MAGIC)) {
      throw new IOException(where + ": not a .npy array (bad magic bytes)");
    }
    int major = prefix[6] & 0xFF;
    if (major < 1 || major > 3) {
      throw new IOException(
          where + ": unsupported .npy format version " + major + "." + (prefix[7] & 0xFF));
    }
    // Version 1.0 has a 2-byte header length, versions 2.0 and 3.0 a 4-byte one; 3.0 is UTF-8.
    int width = major == 1 ? 2 : 4;
    ByteBuffer length =
        ByteBuffer.wrap(readBytes(in, width, where, "its .npy header"))
            .order(ByteOrder.LITTLE_ENDIAN);
    long headerLength = major == 1 ? length.getShort() & 0xFFFF : length.getInt() & 0xFFFFFFFFL;
    if (headerLength > 1 << 20) {
      throw new IOException(where + ": implausible .npy header length " + headerLength);
    }
    byte[] header = readBytes(in, (int) headerLength, where, "its .npy header");
    String text = new String(header, StandardCharsets.ISO_8859_1);
    if (major == 3) {
      try {
        text = StandardCharsets.UTF_8.newDecoder().decode(ByteBuffer.wrap(header)).toString();
      } catch (CharacterCodingException e) {
        throw new IOException(where + ": its .npy header is not UTF-8", e);
      }
    }
    return new Header(text, 8 + width + headerLength);
  }

  private static byte[] readBytes(EntryStream in, int n, String where, String what)
      throws IOException {
    byte[] b = in.read(n);
    if (b.length < n) {
      throw new IOException(where + ": truncated (it ends inside " + what + ")");
    }
    return b;
  }

  private static String shown(String text) {
    String s = text.strip();
    return s.length() <= 200 ? s : s.substring(0, 200) + "...";
  }

  /**
   * The tokens of a {@code .npy} header, as npzfile.py's _TOKEN takes them: quoted strings (no
   * backslash inside), True/False, decimal integers without leading zeros, and {@code {}():,}; each
   * a pair {kind, text}.
   */
  private static List<String[]> tokens(String text, String where) throws IOException {
    List<String[]> out = new ArrayList<>();
    int pos = 0;
    int len = text.length();
    while (true) {
      while (pos < len && " \t\r\n".indexOf(text.charAt(pos)) >= 0) {
        pos++;
      }
      if (pos == len) {
        return out;
      }
      char c = text.charAt(pos);
      if (c == '\'' || c == '"') {
        int close = pos + 1;
        while (close < len && text.charAt(close) != c && text.charAt(close) != '\\') {
          close++;
        }
        if (close == len || text.charAt(close) != c) {
          break;
        }
        out.add(new String[] {"str", text.substring(pos + 1, close)});
        pos = close + 1;
      } else if (text.startsWith("True", pos) || text.startsWith("False", pos)) {
        String word = text.startsWith("True", pos) ? "True" : "False";
        out.add(new String[] {"bool", word});
        pos += word.length();
      } else if (c >= '0' && c <= '9') {
        int stop = pos + 1;
        while (c != '0' && stop < len && text.charAt(stop) >= '0' && text.charAt(stop) <= '9') {
          stop++;
        }
        out.add(new String[] {"int", text.substring(pos, stop)});
        pos = stop;
      } else if ("{}():,".indexOf(c) >= 0) {
        out.add(new String[] {String.valueOf(c), String.valueOf(c)});
        pos++;
      } else {
        break;
      }
    }
    throw new IOException(where + ": unreadable .npy header " + shown(text));
  }

  /**
   * A {@code .npy} header: a dict of exactly 'descr' (a string), 'fortran_order' (True or False)
   * and 'shape' (a tuple of integers), each once: {descr, fortran order, shape}.
   */
  private static Object[] parseHeader(String text, String where) throws IOException {
    IOException bad = new IOException(where + ": unreadable .npy header " + shown(text));
    List<String[]> t = tokens(text, where);
    Map<String, Object[]> fields = new HashMap<>();
    int[] i = {0};
    Predicate<String> at = k -> i[0] < t.size() && t.get(i[0])[0].equals(k);
    if (!at.test("{")) {
      throw bad;
    }
    i[0]++;
    while (!at.test("}")) {
      if (!at.test("str")) {
        throw bad;
      }
      String key = t.get(i[0]++)[1];
      if (!at.test(":")) {
        throw bad;
      }
      i[0]++;
      if (i[0] >= t.size()) {
        throw bad;
      }
      String kind = t.get(i[0])[0];
      Object value;
      if (kind.equals("str") || kind.equals("bool")) {
        String v = t.get(i[0]++)[1];
        value = kind.equals("str") ? v : (Object) v.equals("True");
      } else if (kind.equals("(")) {
        i[0]++;
        List<Integer> dims = new ArrayList<>();
        while (!at.test(")")) {
          if (!at.test("int")) {
            throw bad;
          }
          String digits = t.get(i[0]++)[1];
          if (digits.length() > 10 || Long.parseLong(digits) > MAX_ELEMENTS) {
            throw new IOException(where + ": bad shape in its .npy header " + shown(text));
          }
          dims.add(Integer.parseInt(digits));
          if (at.test(")")) {
            if (dims.size() == 1) {
              throw bad; // (5) is not a tuple
            }
            break;
          }
          if (!at.test(",")) {
            throw bad;
          }
          i[0]++;
        }
        i[0]++; // the ")"
        value = dims.stream().mapToInt(Integer::intValue).toArray();
      } else {
        throw bad;
      }
      if (fields.containsKey(key)) {
        throw new IOException(where + ": its .npy header gives '" + key + "' twice");
      }
      if (!Arrays.asList(KEYS).contains(key)) {
        throw new IOException(
            where + ": its .npy header has a key '" + key + "' other than "
                + String.join(", ", KEYS));
      }
      fields.put(key, new Object[] {kind, value});
      if (at.test("}")) {
        break;
      }
      if (!at.test(",")) {
        throw bad;
      }
      i[0]++;
    }
    i[0]++; // the "}"
    if (i[0] != t.size() || fields.size() != KEYS.length) {
      throw bad;
    }
    String[] kinds = {"str", "bool", "("};
    Object[] out = new Object[3];
    for (int k = 0; k < 3; k++) {
      Object[] f = fields.get(KEYS[k]);
      if (!f[0].equals(kinds[k])) {
        throw bad;
      }
      out[k] = f[1];
    }
    return out;
  }

  /** A move of one element: row-major position {@code i} takes column-major {@code from}. */
  private interface Move {
    void at(int i, int from);
  }

  /** For each element in row-major order, its position in column-major order, to {@code move}. */
  private static void fromColumnMajor(int[] shape, Move move) {
    int[] strides = new int[shape.length];
    int stride = 1;
    for (int k = 0; k < shape.length; k++) {
      strides[k] = stride;
      stride *= shape[k];
    }
    int[] index = new int[shape.length];
    int pos = 0;
    for (int i = 0; i < stride; i++) {
      move.at(i, pos);
      // Advance the row-major index, last axis fastest, keeping pos the column-major offset.
      for (int k = shape.length - 1; k >= 0; k--) {
        index[k]++;
        pos += strides[k];
        if (index[k] < shape[k]) {
          break;
        }
        pos -= strides[k] * shape[k];
        index[k] = 0;
      }
    }
  }

  /**
   * An element type of a {@code .npy} header ({@code <f4}, {@code >i2}, ...): kind, size, byte
   * order.
   */
  private record Dtype(String descr, boolean isFloat, boolean unsigned, int size, ByteOrder order) {
    static Dtype parse(String descr, String where) throws IOException {
      if (descr.length() == 3) {
        char byteOrder = descr.charAt(0);
        char kind = descr.charAt(1);
        int size = descr.charAt(2) - '0';
        ByteOrder order =
            byteOrder == '>'
                ? ByteOrder.BIG_ENDIAN
                : byteOrder == '=' ? ByteOrder.nativeOrder() : ByteOrder.LITTLE_ENDIAN;
        boolean knownOrder = "<>=|".indexOf(byteOrder) >= 0;
        if (knownOrder && kind == 'f' && (size == 2 || size == 4 || size == 8)) {
          return new Dtype(descr, true, false, size, order);
        }
        if (knownOrder
            && (kind == 'i' || kind == 'u')
            && (size == 1 || size == 2 || size == 4 || size == 8)) {
          return new Dtype(descr, false, kind == 'u', size, order);
        }
      }
      throw new IOException(
          where + ": unsupported element type '" + descr + "' (expected floats or integers)");
    }

    /** The next element of {@code b} as a float (float64 rounds to nearest, as NumPy's astype). */
    float readFloat(ByteBuffer b) {
      return switch (size) {
        case 2 -> halfToFloat(b.getShort());
        case 4 -> b.getFloat();
        default -> (float) b.getDouble();
      };
    }

    /** The next element of {@code b} as an int64. */
    long readLong(ByteBuffer b, String where) throws IOException {
      long v =
          switch (size) {
            case 1 -> unsigned ? b.get() & 0xFFL : b.get();
            case 2 -> unsigned ? b.getShort() & 0xFFFFL : b.getShort();
            case 4 -> unsigned ? b.getInt() & 0xFFFFFFFFL : b.getInt();
            default -> b.getLong();
          };
      if (unsigned && v < 0) {
        throw new IOException(
            where + ": the value " + Long.toUnsignedString(v) + " does not fit in int64");
      }
      return v;
    }

    /** IEEE half to float (exact: every half is a float). */
    private static float halfToFloat(short h) {
      int sign = (h >>> 15) & 1;
      int exponent = (h >>> 10) & 0x1F;
      int mantissa = h & 0x3FF;
      float magnitude;
      if (exponent == 0x1F) {
        magnitude = mantissa == 0 ? Float.POSITIVE_INFINITY : Float.NaN;
      } else if (exponent == 0) {
        magnitude = mantissa * 0x1.0p-24f;
      } else {
        magnitude = Float.intBitsToFloat((exponent + 112) << 23 | mantissa << 13);
      }
      return sign == 1 ? -magnitude : magnitude;
    }
  }

  // ---- writing ----

  private static void writeEntry(ZipOutputStream zip, String entryName, Array array)
      throws IOException {
    byte[] header = npyHeader(array);
    CRC32 crc = new CRC32();
    crc.update(header);
    long dataBytes = (long) array.numel() * (array.isFloat() ? 4 : 8);
    writeData(array, crc::update);
    ZipEntry entry = new ZipEntry(entryName);
    entry.setMethod(ZipEntry.STORED);
    entry.setSize(header.length + dataBytes);
    entry.setCompressedSize(header.length + dataBytes);
    entry.setCrc(crc.getValue());
    zip.putNextEntry(entry);
    zip.write(header);
    writeData(array, zip::write);
    zip.closeEntry();
  }

  /** A sink for byte ranges: a checksum or a stream. */
  private interface ByteSink {
    void write(byte[] b, int off, int len) throws IOException;
  }

  /** Little-endian elements of {@code array}, in chunks of at most {@link #CHUNK} bytes. */
  private static void writeData(Array array, ByteSink sink) throws IOException {
    ByteBuffer buf = ByteBuffer.allocate(CHUNK).order(ByteOrder.LITTLE_ENDIAN);
    int n = array.numel();
    int perChunk = CHUNK / (array.isFloat() ? 4 : 8);
    for (int lo = 0; lo < n; lo += perChunk) {
      int hi = Math.min(n, lo + perChunk);
      buf.clear();
      if (array.isFloat()) {
        buf.asFloatBuffer().put(array.floats, lo, hi - lo);
        buf.position((hi - lo) * 4);
      } else {
        buf.asLongBuffer().put(array.longs, lo, hi - lo);
        buf.position((hi - lo) * 8);
      }
      sink.write(buf.array(), 0, buf.position());
    }
  }

  /** A version 1.0 header, padded with spaces so that the data starts at a multiple of 64 bytes. */
  private static byte[] npyHeader(Array array) {
    StringBuilder shape = new StringBuilder("(");
    for (int k = 0; k < array.shape.length; k++) {
      shape.append(k == 0 ? "" : ", ").append(array.shape[k]);
    }
    shape.append(array.shape.length == 1 ? ",)" : ")");
    String dict =
        String.format(
            "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
            array.isFloat() ? "<f4" : "<i8", shape);
    int total = MAGIC.length + 4 + dict.length() + 1;
    int padded = (total + 63) / 64 * 64;
    String text = dict + " ".repeat(padded - total) + "\n";
    ByteBuffer b = ByteBuffer.allocate(padded).order(ByteOrder.LITTLE_ENDIAN);
    b.put(MAGIC).put((byte) 1).put((byte) 0).putShort((short) text.length());
    b.put(text.getBytes(StandardCharsets.ISO_8859_1));
    return b.array();
  }

  private static long count(int[] shape) {
    long n = 1;
    for (int d : shape) {
      n *= d;
    }
    return n;
  }
}
