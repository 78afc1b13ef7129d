package deepdsl.runtime;

import java.awt.color.ColorSpace;
import java.awt.image.BufferedImage;
import java.awt.image.ColorModel;
import java.awt.image.IndexColorModel;
import java.awt.image.Raster;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.stream.Stream;
import javax.imageio.ImageIO;
import javax.imageio.ImageReader;
import javax.imageio.stream.ImageInputStream;

/**
 * Image folders ({@code --data images:DIR}), read as {@code deepdsl/data/images.py} reads them with
 * javax.imageio: one subfolder per class, the folder names sorted by code point giving the class
 * ids, DIR/train and DIR/test as the splits where DIR/train exists. Every image must be the
 * input's W x H; pixels become float32 {@code byte / 255} in {@code [M, C, H, W]}. PNG images give
 * the Python side's arrays exactly; errors are worded as there.
 */
final class ImageFolder {
  // the pixels of one split in one Java array
  private static final long MAX_ELEMENTS = Integer.MAX_VALUE - 8;
  private static final Comparator<String> CODE_POINTS =
      (a, b) -> Arrays.compare(a.codePoints().toArray(), b.codePoints().toArray());

  private ImageFolder() {}

  /** One split's files and their class ids, and the class names. */
  private record Split(List<Path> files, List<Integer> ids, List<String> names) {}

  /**
   * The samples of {@code directory} for an input taking {@code shape} ({@code [C, H, W]}) per
   * sample and {@code classes} classes; {@code describe} and {@code label} name the input and the
   * label in errors. Returns {x, y, xTest, yTest} (the test pair null without a test split).
   */
  static float[][] load(String directory, int[] shape, int classes, String describe, String label)
      throws IOException {
    Path dir = Path.of(directory);
    if (!Files.isDirectory(dir)) {
      throw new IOException("images data folder not found: '" + directory + "'");
    }
    if (shape.length != 3 || (shape[0] != 1 && shape[0] != 3)) {
      throw new IOException(
          "images data fills an input that takes images [N, C, H, W] with C = 1 (grayscale) or 3"
              + " (RGB), not the network's "
              + describe);
    }
    Path trainDir = dir.resolve("train");
    boolean split = Files.isDirectory(trainDir);
    String folder = split ? join(directory, "train") : directory;
    Split train = split(folder, null, classes, label);
    float[] x = pixels(train.files(), shape, describe, folder);
    float[] y = ids(train.ids());
    if (!(split && Files.isDirectory(dir.resolve("test")))) {
      return new float[][] {x, y, null, null};
    }
    String testFolder = join(directory, "test");
    Split test = split(testFolder, train.names(), classes, label);
    return new float[][] {x, y, pixels(test.files(), shape, describe, testFolder), ids(test.ids())};
  }

  /** As Python's os.path.join of two parts. */
  private static String join(String a, String b) {
    return a.endsWith("/") ? a + b : a + "/" + b;
  }

  private static float[] ids(List<Integer> ids) {
    float[] out = new float[ids.size()];
    for (int k = 0; k < out.length; k++) {
      out[k] = ids.get(k);
    }
    return out;
  }

  private static List<String> entries(String folder) throws IOException {
    try (Stream<Path> s = Files.list(Path.of(folder))) {
      return s.map(p -> p.getFileName().toString())
          .filter(n -> !n.startsWith("."))
          .sorted(CODE_POINTS)
          .toList();
    } catch (IOException e) {
      throw new IOException("cannot list the images folder '" + folder + "': " + e.getMessage());
    }
  }

  private static Split split(String folder, List<String> known, int classes, String label)
      throws IOException {
    List<String> names = entries(folder);
    for (String n : names) {
      if (!Files.isDirectory(Path.of(folder, n))) {
        throw new IOException(
            String.format(
                "images folder '%s': '%s' lies outside a class folder (each class is a folder of"
                    + " its images)",
                folder, n));
      }
    }
    if (names.isEmpty()) {
      throw new IOException(
          "images folder '"
              + folder
              + "' holds no class folders (one folder per class, its images inside)");
    }
    if (known == null && names.size() > classes) {
      throw new IOException(
          String.format(
              "images folder '%s' has %d class folders, more than the %d classes of the network's %s",
              folder, names.size(), classes, label));
    }
    List<Path> files = new ArrayList<>();
    List<Integer> ids = new ArrayList<>();
    for (String n : names) {
      if (known != null && !known.contains(n)) {
        throw new IOException(
            String.format(
                "images folder '%s': the test folder '%s' is not a class of the training folders",
                folder, n));
      }
    }
    for (String n : names) {
      String sub = join(folder, n);
      List<String> inside = entries(sub);
      for (String f : inside) {
        String lower = f.toLowerCase(Locale.ROOT);
        boolean image = lower.endsWith(".png") || lower.endsWith(".jpg") || lower.endsWith(".jpeg");
        if (!image || !Files.isRegularFile(Path.of(sub, f))) {
          throw new IOException(
              String.format(
                  "images folder '%s': '%s' is not a .png, .jpg or .jpeg file", sub, f));
        }
      }
      if (inside.isEmpty()) {
        throw new IOException(
            String.format(
                "images folder '%s': the class folder '%s' holds no images", folder, n));
      }
      int id = (known != null ? known : names).indexOf(n);
      for (String f : inside) {
        files.add(Path.of(join(sub, f)));
        ids.add(id);
      }
    }
    return new Split(files, ids, names);
  }

  private static float[] pixels(List<Path> files, int[] shape, String describe, String folder)
      throws IOException {
    long per = (long) shape[0] * shape[1] * shape[2];
    if (files.size() * per > MAX_ELEMENTS) {
      throw new IOException(
          String.format(
              Locale.ROOT,
              "images folder '%s' holds %,d images of %,d values, more than %,d values in all"
                  + " (2^31 - 9, one Java array)",
              folder, files.size(), per, MAX_ELEMENTS));
    }
    float[] out = new float[Math.toIntExact(files.size() * per)];
    for (int k = 0; k < files.size(); k++) {
      read(files.get(k), shape, describe, out, Math.toIntExact(k * per));
    }
    return out;
  }

  /** Decodes one image into {@code out} at {@code at}, {@code [C, H, W]}, after checking its size. */
  private static void read(Path path, int[] shape, String describe, float[] out, int at)
      throws IOException {
    int c = shape[0];
    int h = shape[1];
    int w = shape[2];
    BufferedImage img;
    try (ImageInputStream in = ImageIO.createImageInputStream(path.toFile())) {
      Iterator<ImageReader> readers = in == null ? null : ImageIO.getImageReaders(in);
      if (readers == null || !readers.hasNext()) {
        throw new IOException(
            "image '" + path + "' cannot be read as an image: not a PNG or JPEG file");
      }
      ImageReader reader = readers.next();
      try {
        reader.setInput(in, true, true);
        int width = reader.getWidth(0);
        int height = reader.getHeight(0);
        if (width != w || height != h) {
          throw new IOException(
              String.format(
                  "image '%s' is %dx%d (width x height), but the network's input takes %dx%d:"
                      + " resize the images beforehand",
                  path, width, height, w, h));
        }
        img = reader.read(0);
      } finally {
        reader.dispose();
      }
    } catch (IOException e) {
      if (e.getMessage() != null && e.getMessage().startsWith("image '")) {
        throw e;
      }
      throw new IOException("image '" + path + "' cannot be read as an image: " + e.getMessage());
    } catch (RuntimeException e) { // a decoder's failure on a malformed file
      throw new IOException("image '" + path + "' cannot be read as an image: " + e);
    }
    ColorModel cm = img.getColorModel();
    Raster r = img.getRaster();
    int plane = h * w;
    if (cm instanceof IndexColorModel icm) { // a palette (also 1-bit grayscale PNG files)
      if (icm.getPixelSize() > 8) {
        throw unsupported(path, "a palette of more than 256 colours");
      }
      boolean gray = true;
      for (int k = 0; k < icm.getMapSize(); k++) {
        gray &= icm.getRed(k) == icm.getGreen(k) && icm.getGreen(k) == icm.getBlue(k);
      }
      if (c == 1 && !gray) {
        throw colour(path, "P", describe);
      }
      for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
          int index = r.getSample(x, y, 0);
          int[] rgb = {icm.getRed(index), icm.getGreen(index), icm.getBlue(index)};
          for (int ch = 0; ch < c; ch++) {
            out[at + ch * plane + y * w + x] = rgb[ch] / 255f;
          }
        }
      }
      return;
    }
    int type = cm.getColorSpace().getType();
    int colours = cm.getNumColorComponents();
    for (int k = 0; k < cm.getNumComponents(); k++) {
      if (cm.getComponentSize(k) != 8) {
        throw unsupported(path, cm.getComponentSize(k) + "-bit samples");
      }
    }
    boolean gray = type == ColorSpace.TYPE_GRAY && colours == 1;
    if (!gray && !(type == ColorSpace.TYPE_RGB && colours == 3)) {
      throw unsupported(path, "colour space " + type);
    }
    if (c == 1 && !gray) {
      throw colour(path, cm.hasAlpha() ? "RGBA" : "RGB", describe);
    }
    for (int y = 0; y < h; y++) {
      for (int x = 0; x < w; x++) {
        for (int ch = 0; ch < c; ch++) {
          out[at + ch * plane + y * w + x] = r.getSample(x, y, gray ? 0 : ch) / 255f;
        }
      }
    }
  }

  private static IOException colour(Path path, String mode, String describe) {
    return new IOException(
        String.format(
            "image '%s' is a colour image (%s), but the network's %s takes grayscale images",
            path, mode, describe));
  }

  private static IOException unsupported(Path path, String what) {
    return new IOException(
        String.format(
            "image '%s' has %s; images data takes 8-bit grayscale, RGB, RGBA or palette images",
            path, what));
  }
}
