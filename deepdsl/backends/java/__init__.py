"""The Java backend: a network's planned programs as one Java class, plus the runtime it needs."""

from __future__ import annotations

from pathlib import Path

from deepdsl.api import Compilation, Options, optimise
from deepdsl.autodiff import infer_program
from deepdsl.backends.java.emitter import DEFAULT_WORKSPACE_LIMIT, emit_java, runtime_sources
from deepdsl.backends.java.names import class_name
from deepdsl.errors import DslProgramError
from deepdsl.memory import plan

__all__ = ["DEFAULT_WORKSPACE_LIMIT", "class_name", "java_source", "runtime_sources", "write_maven", "write_sources"]


def java_source(c: Compilation, options: Options, workspace_limit: int = DEFAULT_WORKSPACE_LIMIT) -> str:
    """The Java class of a compilation that reached the `plan` stage."""
    assert c.program is not None and c.plan is not None
    has_predict = any(name == "predict" for name, _ in c.program.graph.outputs)
    infer = plan(optimise(infer_program(c.program.graph), options)[0]) if has_predict else None
    return emit_java(c.program, c.plan, infer, workspace_limit)


def write_sources(folder: Path, name: str, text: str) -> None:
    """`folder/Name.java` and the runtime under `folder/deepdsl/runtime/`."""
    runtime = folder / "deepdsl" / "runtime"
    try:
        runtime.mkdir(parents=True, exist_ok=True)
        for file, source in runtime_sources().items():
            (runtime / file).write_text(source)
        (folder / f"{name}.java").write_text(text)
    except OSError as exc:
        raise DslProgramError(f"cannot write the Java program into '{folder}': {exc.strerror or exc}") from None


def write_ptx(folder: Path, name: str, modules: dict[str, str]) -> list[Path]:
    """`folder/Name.ARCH.ptx` for each arch's PTX module (DESIGN §9); the paths written."""
    paths = [folder / f"{name}.{arch}.ptx" for arch in modules]
    try:
        for path, text in zip(paths, modules.values()):
            path.write_text(text)
    except OSError as exc:
        raise DslProgramError(f"cannot write the PTX into '{folder}': {exc.strerror or exc}") from None
    return paths


def build_commands(folder: Path, name: str) -> list[str]:
    """How to build and run the class written into `folder`: on the CPU alone, and with the JCuda jars."""
    build, source = folder / "build", folder / f"{name}.java"
    return [
        f"CPU:  javac -d {build} -sourcepath {folder} {source} && java -cp {build} {name}",
        f"CUDA: javac -cp 'JCUDA_JARS/*' -d {build} {source} {folder}/deepdsl/runtime/*.java"
        f" && java -cp '{build}:JCUDA_JARS/*' {name} --device cuda",
    ]


def write_maven(folder: Path, name: str, text: str) -> None:
    """A Maven project: pom.xml (JCuda, JCublas and their linux-x86_64 natives), the network and the runtime."""
    write_sources(folder / "src" / "main" / "java", name, text)
    try:
        (folder / "pom.xml").write_text(POM.format(artifact=name.lower(), main=name, jcuda=JCUDA_VERSION))
    except OSError as exc:
        raise DslProgramError(f"cannot write '{folder / 'pom.xml'}': {exc.strerror or exc}") from None


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
    <dependency>
      <groupId>org.jcuda</groupId>
      <artifactId>jcublas</artifactId>
      <version>${{jcuda.version}}</version>
    </dependency>
    <dependency>
      <groupId>org.jcuda</groupId>
      <artifactId>jcublas-natives</artifactId>
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
