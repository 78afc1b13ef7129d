package deepdsl.runtime;

import java.io.BufferedOutputStream;
import java.io.IOException;
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
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.zip.CRC32;
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

    Array(int[] shape, float[] floats, long[] longs) {
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
   * file order. The ZIP container is read by the steps and rules of {@code deepdsl/npzfile/}
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
      if (Arrays.equals(ZipReader.readAt(channel, 0, (int) Math.min(size, Npy.MAGIC.length)), Npy.MAGIC)) {
        throw new IOException(file + " is a single .npy array, not an .npz archive");
      }
      ZipReader.Directory directory = ZipReader.directory(channel, size, file);
      ZipReader.checkEntries(directory.entries(), size, directory.start(), file);
      LinkedHashMap<String, Array> out = new LinkedHashMap<>();
      for (ZipReader.ZipRecord e : directory.entries()) {
        if (!e.name().endsWith("/")) {
          ZipReader.EntryStream in = ZipReader.open(channel, e, directory.start(), file);
          out.put(ZipReader.arrayName(e.name()), Npy.read(in, e.size(), in.where));
          in.finish();
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
                  new BufferedOutputStream(Channels.newOutputStream(channel), ZipReader.CHUNK))) {
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

  // ---- writing ----

  private static void writeEntry(ZipOutputStream zip, String entryName, Array array)
      throws IOException {
    byte[] header = Npy.header(array);
    CRC32 crc = new CRC32();
    crc.update(header);
    long dataBytes = (long) array.numel() * (array.isFloat() ? 4 : 8);
    Npy.writeData(array, crc::update);
    ZipEntry entry = new ZipEntry(entryName);
    entry.setMethod(ZipEntry.STORED);
    entry.setSize(header.length + dataBytes);
    entry.setCompressedSize(header.length + dataBytes);
    entry.setCrc(crc.getValue());
    zip.putNextEntry(entry);
    zip.write(header);
    Npy.writeData(array, zip::write);
    zip.closeEntry();
  }

  private static long count(int[] shape) {
    long n = 1;
    for (int d : shape) {
      n *= d;
    }
    return n;
  }
}
