package deepdsl.runtime;

import java.io.BufferedOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.Channels;
import java.nio.channels.FileChannel;
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
import java.util.Arrays;
import java.util.Enumeration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.zip.CRC32;
import java.util.zip.CheckedInputStream;
import java.util.zip.ZipEntry;
import java.util.zip.ZipException;
import java.util.zip.ZipFile;
import java.util.zip.ZipOutputStream;

/**
 * NumPy {@code .npz} archives (DESIGN §9): what {@code np.savez} and {@code deepdsl/checkpoint.py}
 * write.
 *
 * <p>An archive is an uncompressed ZIP with one {@code NAME.npy} entry per array, in insertion
 * order; a name may hold dots and slashes ({@code cv1.W}, {@code opt/cv1.W/momentum}, {@code
 * opt/step}). Reading accepts {@code .npy} format versions 1.0, 2.0 and 3.0, C or Fortran order,
 * either byte order, floats (float16/32/64, given back as float32) and integers (8 to 64 bits,
 * signed or not, given back as int64). Writing produces version 1.0 entries of little-endian
 * float32 ({@code <f4}) and int64 ({@code <i8}).
 */
public final class Npz {
  private static final byte[] MAGIC = {(byte) 0x93, 'N', 'U', 'M', 'P', 'Y'};
  private static final int CHUNK = 1 << 16;
  private static final long MAX_ENTRY_BYTES = 1L << 32; // an entry this large or larger is refused
  private static final int MAX_ELEMENTS = Integer.MAX_VALUE - 8; // the most of one Java array
  private static final String TEMP_SUFFIX = ".deepdsl-tmp";
  private static final int NAME_MAX = 255; // the longest name of a file (bytes) on Linux's file systems
  private static final Pattern DESCR = Pattern.compile("'descr'\\s*:\\s*'([^']*)'");
  private static final Pattern FORTRAN = Pattern.compile("'fortran_order'\\s*:\\s*(True|False)");
  private static final Pattern SHAPE = Pattern.compile("'shape'\\s*:\\s*\\(([^)]*)\\)");

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
   * file order.
   *
   * @throws IOException when the file is missing, is not a ZIP archive, or holds an entry that is
   *     not a {@code .npy} array of a supported type; the message names the file and the entry
   */
  public static LinkedHashMap<String, Array> read(Path path) throws IOException {
    if (!Files.isRegularFile(path)) {
      throw new IOException("npz file not found: '" + path + "'");
    }
    checkEnd(path);
    LinkedHashMap<String, Array> out = new LinkedHashMap<>();
    ZipFile zip;
    try {
      zip = new ZipFile(path.toFile());
    } catch (ZipException e) {
      throw new IOException("'" + path + "' is not an .npz archive (" + e.getMessage() + ")", e);
    }
    try (zip) {
      Enumeration<? extends ZipEntry> entries = zip.entries();
      while (entries.hasMoreElements()) {
        ZipEntry entry = entries.nextElement();
        if (entry.isDirectory()) {
          continue;
        }
        String entryName = entry.getName();
        String name =
            entryName.endsWith(".npy") ? entryName.substring(0, entryName.length() - 4) : entryName;
        String where = "npz file '" + path + "', entry '" + entryName + "'";
        if (out.containsKey(name)) {
          throw new IOException(where + ": the array '" + name + "' appears twice");
        }
        long size = entry.getSize();
        if (size >= MAX_ENTRY_BYTES) {
          throw new IOException(
              where + " is " + size + " bytes; entries of 4 GiB or more are not read");
        }
        if (size < 0) {
          throw new IOException(where + ": its size is not recorded");
        }
        if (entry.getMethod() == ZipEntry.STORED && entry.getCompressedSize() != size) {
          throw new IOException(
              where
                  + ": a stored entry of "
                  + size
                  + " bytes that takes "
                  + entry.getCompressedSize());
        }
        CRC32 crc = new CRC32();
        try (InputStream in = new CheckedInputStream(zip.getInputStream(entry), crc)) {
          out.put(name, readNpy(in, size, where));
        } catch (ZipException | EOFException e) {
          throw new IOException(where + ": damaged ZIP data (" + e.getMessage() + ")", e);
        }
        if (crc.getValue() != entry.getCrc()) {
          throw new IOException(
              String.format(
                  "%s: damaged ZIP data (its CRC-32 is %08x, the archive records %08x)",
                  where, crc.getValue(), entry.getCrc()));
        }
      }
    }
    return out;
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

  /**
   * Refuse bytes after the archive's end record (which ZipFile would skip): the record is 22 bytes
   * and a comment of at most 65535.
   */
  private static void checkEnd(Path path) throws IOException {
    byte[] tail;
    try (RandomAccessFile file = new RandomAccessFile(path.toFile(), "r")) {
      long size = file.length();
      tail = new byte[(int) Math.min(size, 22 + 65535)];
      file.seek(size - tail.length);
      file.readFully(tail);
    }
    int shortBy = -1; // the bytes after the last record that ends before the file does
    for (int at = tail.length - 22; at >= 0; at--) {
      if (tail[at] == 'P' && tail[at + 1] == 'K' && tail[at + 2] == 5 && tail[at + 3] == 6) {
        int end = at + 22 + ((tail[at + 20] & 0xFF) | (tail[at + 21] & 0xFF) << 8);
        if (end == tail.length) {
          return; // (a record-like pattern inside the comment cannot hide this one)
        }
        if (end < tail.length && shortBy < 0) {
          shortBy = tail.length - end;
        }
      }
    }
    if (shortBy >= 0) {
      throw new IOException(
          "npz file '" + path + "': " + shortBy + " bytes of other data after the archive's end");
    }
    // no end record: ZipFile says what it finds
  }

  private static Array readNpy(InputStream in, long size, String where) throws IOException {
    Header h = readHeader(in, where);
    String header = h.text();
    Dtype dtype = Dtype.parse(field(DESCR, header, where), where);
    boolean columnMajor = field(FORTRAN, header, where).equals("True");
    int[] shape = parseShape(field(SHAPE, header, where), where);
    int count = (int) count(shape);
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
    if (in.read() != -1) {
      throw new IOException(where + ": more data than its header's " + what);
    }
    if (columnMajor && shape.length > 1) {
      int[] from = columnMajorIndex(shape);
      if (floats != null) {
        float[] src = floats.clone();
        for (int i = 0; i < count; i++) {
          floats[i] = src[from[i]];
        }
      } else {
        long[] src = longs.clone();
        for (int i = 0; i < count; i++) {
          longs[i] = src[from[i]];
        }
      }
    }
    return new Array(shape, floats, longs);
  }

  /** The header of a {@code .npy} stream: its text, and its size with the magic bytes. */
  private record Header(String text, long bytes) {}

  /** The header of a {@code .npy} stream, which is left at the first data byte. */
  private static Header readHeader(InputStream in, String where) throws IOException {
    byte[] prefix = in.readNBytes(8);
    if (prefix.length < 8 || !Arrays.equals(Arrays.copyOf(prefix, 6), MAGIC)) {
      throw new IOException(where + ": not a .npy array (bad magic bytes)");
    }
    int major = prefix[6];
    if (major < 1 || major > 3) {
      throw new IOException(where + ": unsupported .npy format version " + major + "." + prefix[7]);
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
    String text =
        new String(header, major == 3 ? StandardCharsets.UTF_8 : StandardCharsets.ISO_8859_1);
    return new Header(text, 8 + width + headerLength);
  }

  /** The text of one field of a header, matched by {@code pattern}'s group 1. */
  private static String field(Pattern pattern, String header, String where) throws IOException {
    Matcher m = pattern.matcher(header);
    if (!m.find()) {
      throw new IOException(where + ": unreadable .npy header " + header.strip());
    }
    return m.group(1);
  }

  private static byte[] readBytes(InputStream in, int n, String where, String what)
      throws IOException {
    byte[] b = in.readNBytes(n);
    if (b.length < n) {
      throw new IOException(where + ": truncated (it ends inside " + what + ")");
    }
    return b;
  }

  /**
   * A header's shape tuple ({@code "2, 3"}, {@code "5,"} or empty), checked to fit one Java array.
   */
  private static int[] parseShape(String text, String where) throws IOException {
    String[] parts = text.split(",");
    int rank = parts.length;
    while (rank > 0 && parts[rank - 1].isBlank()) {
      rank--;
    }
    int[] shape = new int[rank];
    try {
      for (int k = 0; k < rank; k++) {
        shape[k] = Integer.parseInt(parts[k].strip());
        if (shape[k] < 0) {
          throw new NumberFormatException("negative dimension");
        }
      }
    } catch (NumberFormatException e) {
      throw new IOException(where + ": bad shape (" + text + ") in its .npy header", e);
    }
    double elements = 1;
    for (int d : shape) {
      elements *= d;
    }
    if (elements > MAX_ELEMENTS) {
      throw new IOException(
          String.format(
              "%s: shape %s holds %.0f elements, more than one array may (%d)",
              where, Arrays.toString(shape), elements, MAX_ELEMENTS));
    }
    return shape;
  }

  /** For each element in row-major order, its position in column-major order. */
  private static int[] columnMajorIndex(int[] shape) {
    int[] strides = new int[shape.length];
    int stride = 1;
    for (int k = 0; k < shape.length; k++) {
      strides[k] = stride;
      stride *= shape[k];
    }
    int[] from = new int[stride];
    int[] index = new int[shape.length];
    int pos = 0;
    for (int i = 0; i < from.length; i++) {
      from[i] = pos;
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
    return from;
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
