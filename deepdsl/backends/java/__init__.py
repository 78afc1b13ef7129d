"""The Java backend: a network's planned programs as one Java class, plus the runtime it needs.

It takes plans (a Build's `train_plan` and `infer_plan`, api.build) and the front end's `Program` for what the
class says around them (its name, the source file, the train block's defaults); it never calls the driver.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

from deepdsl.backends.cuda.translation import entries_source, translation_unit
from deepdsl.backends.java import bf16
from deepdsl.backends.java.emitter import DEFAULT_WORKSPACE_LIMIT, emit_java, runtime_sources
from deepdsl.backends.java.names import class_name
from deepdsl.errors import DslProgramError
from deepdsl.files import check_replaceable, write_atomically
from deepdsl.frontend.program import Program
from deepdsl.memory import Plan

__all__ = [
    "DEFAULT_WORKSPACE_LIMIT", "JavaProgram", "build_commands", "class_name", "java_program", "runtime_sources",
    "write_maven", "write_ptx", "write_sources",
]  # fmt: skip


@dataclass(frozen=True)
class JavaProgram:
    name: str  # the class
    java: str  # Name.java
    cuda: str  # Name.cu: the library, its entry points for the library calls, and the class's kernels


def java_program(
    program: Program, train: Plan, infer: Plan | None, test: Plan, workspace_limit: int = DEFAULT_WORKSPACE_LIMIT,
    deterministic: bool = False,
) -> JavaProgram:  # fmt: skip
    """The Java class of a network from the plans of its training, (with `predict`) inference and test programs (a
    Build's `train_plan`, `infer_plan` and `eval_plan`), and the CUDA source its CUDA device launches: the
    library's entry points for the library calls (dev.conv2d(...)) and one kernel per Kernel constant of the class
    (dev.run(K, ...)). `deterministic`: the CUDA device's cuDNN convolutions are the heuristic's deterministic
    algorithms by default (the program's --deterministic), not the fastest found by timing."""
    e = emit_java(program, train, infer, test, workspace_limit, deterministic)
    library = entries_source()
    # a bf16 program's library calls: entries.cu's entries with their bf16 pointers typed (java/bf16.py)
    typed = bf16.entries(library, [p for p in (train, infer, test) if p is not None])
    cuda = translation_unit(program.graph.name, library + typed, e.kernels)
    return JavaProgram(class_name(program.graph.name), e.java, cuda)


def _subfolder(root: Path, *parts: str) -> Path:
    """`root/parts...`, made where missing; a part that is a symbolic link is refused (never written through)."""
    path = root
    path.mkdir(parents=True, exist_ok=True)
    for part in parts:
        path = path / part
        if path.is_symlink():
            raise OSError(errno.ELOOP, f"'{path}' is a symbolic link; deepdsl writes only into real folders", path)
        path.mkdir(exist_ok=True)
    return path


def _write_all(texts: dict[Path, str], replace_readonly: bool) -> None:
    """Every file of `texts` written atomically (files.py), each checked before the first is written: a link or
    something else that is not a regular file at one of the paths, or (without `replace_readonly`) a read-only
    file, writes none of them."""
    for path in texts:
        check_replaceable(path, replace_readonly=replace_readonly)
    for path, text in texts.items():
        write_atomically(path, text, replace_readonly=replace_readonly)


def write_sources(folder: Path, p: JavaProgram, resources: Path | None = None, replace_readonly: bool = False) -> None:
    """`folder/Name.java`, the runtime under `folder/deepdsl/runtime/`, and `Name.cu` in `resources` (default:
    `folder`), where the CUDA device finds it on the class path. Each file is written atomically; a symbolic link
    at one of the paths (never written through nor replaced) or a read-only file (unless `replace_readonly`)
    writes none of them (files.py)."""
    resources = resources or folder
    try:
        runtime = _subfolder(folder, "deepdsl", "runtime")
        resources.mkdir(parents=True, exist_ok=True)
        texts = {runtime / file: source for file, source in runtime_sources().items()}
        texts[folder / f"{p.name}.java"] = p.java
        texts[resources / f"{p.name}.cu"] = p.cuda
        _write_all(texts, replace_readonly)
    except OSError as exc:
        raise DslProgramError(f"cannot write the Java program into '{folder}': {exc.strerror or exc}") from None


def write_ptx(folder: Path, name: str, modules: dict[str, str], replace_readonly: bool = False) -> list[Path]:
    """`folder/Name.ARCH.ptx` for each arch's PTX module (DESIGN §9); the paths written."""
    paths = [folder / f"{name}.{arch}.ptx" for arch in modules]
    try:
        _write_all(dict(zip(paths, modules.values())), replace_readonly)
    except OSError as exc:
        raise DslProgramError(f"cannot write the PTX into '{folder}': {exc.strerror or exc}") from None
    return paths


def build_commands(folder: Path, name: str) -> list[str]:
    """How to build and run the class written into `folder`: on the CPU alone, and with the JCuda jars."""
    build, source = folder / "build", folder / f"{name}.java"
    return [
        f"CPU:  javac -d {build} -sourcepath {folder} {source} && java -cp {build} {name}",
        f"CUDA: javac -cp 'JCUDA_JARS/*' -d {build} {source} {folder}/deepdsl/runtime/*.java"
        f" && java -cp '{build}:{folder}:JCUDA_JARS/*' {name} --device cuda",
    ]


def write_maven(folder: Path, p: JavaProgram, replace_readonly: bool = False, data_parallel: bool = False) -> Path:
    """A Maven project: pom.xml (JCuda, and OpenBLAS through JavaCPP, with their linux-x86_64 natives; profiles
    cuda13 and cuda12 for JavaCPP's CUDA presets; with `data_parallel`, JNA, the CPU device's MPI binding and
    the CUDA device's way to set NCCL's rendezvous), the network, the runtime, and the CUDA source as a resource
    of the jar; returns the resource folder (where PTX goes too)."""
    try:
        java, resources = _subfolder(folder, "src", "main", "java"), _subfolder(folder, "src", "main", "resources")
    except OSError as exc:
        raise DslProgramError(f"cannot write the Maven project into '{folder}': {exc.strerror or exc}") from None
    try:
        check_replaceable(folder / "pom.xml", replace_readonly=replace_readonly)
    except OSError as exc:
        raise DslProgramError(f"cannot write '{folder / 'pom.xml'}': {exc.strerror or exc}") from None
    write_sources(java, p, resources, replace_readonly)
    try:
        pom = POM.format(artifact=p.name.lower(), main=p.name, jcuda=JCUDA_VERSION, cuda_deps=CUDA_PRESETS,
                         jna=JNA if data_parallel else "", **JAVACPP_VERSIONS)  # fmt: skip
        write_atomically(folder / "pom.xml", pom, replace_readonly=replace_readonly)
    except OSError as exc:
        raise DslProgramError(f"cannot write '{folder / 'pom.xml'}': {exc.strerror or exc}") from None
    return resources


JCUDA_VERSION = "12.6.0"
# JavaCPP's presets: one JavaCPP version per build (the OpenBLAS presets exist for 1.5.13 and 1.5.12, not 1.5.14)
JAVACPP_VERSIONS = {"javacpp": "1.5.13", "openblas": "0.3.31-1.5.13", "cuda13": "13.1-9.19-1.5.13",
                    "javacpp12": "1.5.12", "openblas12": "0.3.30-1.5.12", "cuda12": "12.9-9.10-1.5.12"}  # fmt: skip
# JNA: the data-parallel runtime's binding to MPI's C library and libc's setenv (the runtime names it by
# reflection: a program that never starts MPI or NCCL runs without it)
JNA = """
    <dependency>
      <groupId>net.java.dev.jna</groupId>
      <artifactId>jna</artifactId>
      <version>5.19.1</version>
    </dependency>"""
CUDA_PRESETS = """
        <dependency>
          <groupId>org.bytedeco</groupId>
          <artifactId>cuda</artifactId>
          <version>${cuda.version}</version>
        </dependency>
        <dependency>
          <groupId>org.bytedeco</groupId>
          <artifactId>cuda</artifactId>
          <version>${cuda.version}</version>
          <classifier>linux-x86_64</classifier>
        </dependency>"""

# The jar's manifest names the main class and the dependency jars, which `package` copies to target/lib/;
# plugin versions are pinned to those Maven 3.8 uses by default.
POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>deepdsl.generated</groupId>
  <artifactId>{artifact}</artifactId>
  <version>1.0</version>
  <packaging>jar</packaging>

  <properties>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
    <maven.compiler.source>17</maven.compiler.source>
    <maven.compiler.target>17</maven.compiler.target>
    <jcuda.version>{jcuda}</jcuda.version>
    <!-- one JavaCPP version per build: the one the OpenBLAS (and CUDA) presets were built with -->
    <javacpp.version>{javacpp}</javacpp.version>
    <openblas.version>{openblas}</openblas.version>
  </properties>

  <dependencies>
    <dependency>
      <groupId>org.jcuda</groupId>
      <artifactId>jcuda</artifactId>
      <version>${{jcuda.version}}</version>
    </dependency>
    <dependency>
      <groupId>org.jcuda</groupId>
      <artifactId>jcuda-natives</artifactId>
      <version>${{jcuda.version}}</version>
      <classifier>linux-x86_64</classifier>
    </dependency>
    <!-- the CPU device's GEMMs through OpenBLAS (JavaCPP's presets; the natives jar bundles the library) -->
    <dependency>
      <groupId>org.bytedeco</groupId>
      <artifactId>openblas</artifactId>
      <version>${{openblas.version}}</version>
    </dependency>
    <dependency>
      <groupId>org.bytedeco</groupId>
      <artifactId>openblas</artifactId>
      <version>${{openblas.version}}</version>
      <classifier>linux-x86_64</classifier>
    </dependency>
    <dependency>
      <groupId>org.bytedeco</groupId>
      <artifactId>javacpp</artifactId>
      <version>${{javacpp.version}}</version>
      <classifier>linux-x86_64</classifier>
    </dependency>{jna}
  </dependencies>

  <!-- JavaCPP's CUDA presets (cuBLAS, cuDNN) for the CUDA 13 or CUDA 12 libraries a user has: `mvn -P cuda13
       package` or `-P cuda12` (which moves JavaCPP and OpenBLAS back to the presets' 1.5.12) -->
  <profiles>
    <profile>
      <id>cuda13</id>
      <properties>
        <cuda.version>{cuda13}</cuda.version>
      </properties>
      <dependencies>{cuda_deps}
      </dependencies>
    </profile>
    <profile>
      <id>cuda12</id>
      <properties>
        <cuda.version>{cuda12}</cuda.version>
        <javacpp.version>{javacpp12}</javacpp.version>
        <openblas.version>{openblas12}</openblas.version>
      </properties>
      <dependencies>{cuda_deps}
      </dependencies>
    </profile>
  </profiles>

  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-compiler-plugin</artifactId>
        <version>3.1</version>
      </plugin>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-jar-plugin</artifactId>
        <version>2.4</version>
        <configuration>
          <archive>
            <manifest>
              <mainClass>{main}</mainClass>
              <addClasspath>true</addClasspath>
              <classpathPrefix>lib/</classpathPrefix>
            </manifest>
          </archive>
        </configuration>
      </plugin>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>2.8</version>
        <executions>
          <execution>
            <id>copy-dependencies</id>
            <phase>package</phase>
            <goals>
              <goal>copy-dependencies</goal>
            </goals>
            <configuration>
              <outputDirectory>${{project.build.directory}}/lib</outputDirectory>
            </configuration>
          </execution>
        </executions>
      </plugin>
    </plugins>
  </build>
</project>
"""
