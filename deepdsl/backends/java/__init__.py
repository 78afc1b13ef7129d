"""The Java backend: a network's planned programs as one Java class, plus the runtime it needs.

It takes plans (a Build's `train_plan` and `infer_plan`, api.build) and the front end's `Program` for what the
class says around them (its name, the source file, the train block's defaults); it never calls the driver.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

from deepdsl.backends.cuda.kernels import entries_source, translation_unit
from deepdsl.backends.java.emitter import DEFAULT_WORKSPACE_LIMIT, emit_java, runtime_sources
from deepdsl.backends.java.names import class_name
from deepdsl.errors import DslProgramError
from deepdsl.files import write_atomically
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
    program: Program, train: Plan, infer: Plan | None, test: Plan, workspace_limit: int = DEFAULT_WORKSPACE_LIMIT
) -> JavaProgram:
    """The Java class of a network from the plans of its training, (with `predict`) inference and test programs (a
    Build's `train_plan`, `infer_plan` and `eval_plan`), and the CUDA source its CUDA device launches: the
    library's entry points for the library calls (dev.conv2d(...)) and one kernel per Kernel constant of the class
    (dev.run(K, ...))."""
    e = emit_java(program, train, infer, test, workspace_limit)
    cuda = translation_unit(program.graph.name, entries_source(), e.kernels)
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


def write_sources(folder: Path, p: JavaProgram, resources: Path | None = None) -> None:
    """`folder/Name.java`, the runtime under `folder/deepdsl/runtime/`, and `Name.cu` in `resources` (default:
    `folder`), where the CUDA device finds it on the class path. Each file is written atomically and replaces a
    symbolic link in its place rather than writing through it (files.py)."""
    resources = resources or folder
    try:
        runtime = _subfolder(folder, "deepdsl", "runtime")
        resources.mkdir(parents=True, exist_ok=True)
        for file, source in runtime_sources().items():
            write_atomically(runtime / file, source)
        write_atomically(folder / f"{p.name}.java", p.java)
        write_atomically(resources / f"{p.name}.cu", p.cuda)
    except OSError as exc:
        raise DslProgramError(f"cannot write the Java program into '{folder}': {exc.strerror or exc}") from None


def write_ptx(folder: Path, name: str, modules: dict[str, str]) -> list[Path]:
    """`folder/Name.ARCH.ptx` for each arch's PTX module (DESIGN §9); the paths written."""
    paths = [folder / f"{name}.{arch}.ptx" for arch in modules]
    try:
        for path, text in zip(paths, modules.values()):
            write_atomically(path, text)
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


def write_maven(folder: Path, p: JavaProgram) -> Path:
    """A Maven project: pom.xml (JCuda and its linux-x86_64 natives), the network, the runtime, and the CUDA source
    as a resource of the jar; returns the resource folder (where PTX goes too)."""
    try:
        java, resources = _subfolder(folder, "src", "main", "java"), _subfolder(folder, "src", "main", "resources")
    except OSError as exc:
        raise DslProgramError(f"cannot write the Maven project into '{folder}': {exc.strerror or exc}") from None
    write_sources(java, p, resources)
    try:
        write_atomically(folder / "pom.xml", POM.format(artifact=p.name.lower(), main=p.name, jcuda=JCUDA_VERSION))
    except OSError as exc:
        raise DslProgramError(f"cannot write '{folder / 'pom.xml'}': {exc.strerror or exc}") from None
    return resources


JCUDA_VERSION = "12.6.0"

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
  </dependencies>

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
