"""NVRTC's PTX kept by a key of what made it (backends/cuda/nvrtc.py): one compile per translation unit in a process,
and with DEEPDSL_PTX_CACHE=1 one across processes, read back only from a folder and file of this user's alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deepdsl.backends.cuda import nvrtc

pytestmark = pytest.mark.skipif(nvrtc.nvrtc_version() is None, reason="needs NVRTC (the test extra)")

SOURCE = 'extern "C" __global__ void k(float *x) { x[threadIdx.x] += 1.0f; }\n'


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The arch of every real NVRTC compile from here on, with nothing kept in the process before."""
    monkeypatch.setattr(nvrtc, "_recent", {})
    seen: list[str] = []
    real = nvrtc._nvrtc

    def counted(lib, source, arch, name, strict):  # noqa: ANN001, ANN202
        seen.append(arch)
        return real(lib, source, arch, name, strict)

    monkeypatch.setattr(nvrtc, "_nvrtc", counted)
    monkeypatch.delenv("DEEPDSL_PTX_CACHE", raising=False)
    return seen


def test_one_translation_unit_compiles_once_per_process(compiles: list[str]) -> None:
    first = nvrtc.ptx(SOURCE, "sm_80", "a.cu")
    assert nvrtc.ptx(SOURCE, "sm_80", "a.cu") == first
    assert compiles == ["sm_80"]
    nvrtc.ptx(SOURCE, "sm_90", "a.cu")  # another architecture, another name, another source: compiled
    nvrtc.ptx(SOURCE, "sm_80", "b.cu")
    nvrtc.ptx(SOURCE + "// changed\n", "sm_80", "a.cu")
    assert compiles == ["sm_80", "sm_90", "sm_80", "sm_80"]


def test_a_failed_compile_is_not_kept(compiles: list[str]) -> None:
    for _ in range(2):
        with pytest.raises(nvrtc.CudaCompileError):
            nvrtc.ptx("this is not CUDA", "sm_80")
    assert compiles == ["sm_80", "sm_80"]


def test_the_cache_folder_serves_a_later_process(compiles: list[str], monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:  # fmt: skip
    folder = tmp_path / "cache"
    monkeypatch.setenv("DEEPDSL_CACHE", str(folder))
    monkeypatch.setenv("DEEPDSL_PTX_CACHE", "1")
    first = nvrtc.ptx(SOURCE, "sm_80")
    kept = list(folder.glob("ptx-*.ptx"))
    assert len(kept) == 1 and kept[0].read_text() == first
    assert kept[0].stat().st_mode & 0o777 == 0o600
    monkeypatch.setattr(nvrtc, "_recent", {})  # a new process
    assert nvrtc.ptx(SOURCE, "sm_80") == first
    assert compiles == ["sm_80"]


def test_a_cache_file_others_may_write_is_not_read(compiles: list[str], monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:  # fmt: skip
    folder = tmp_path / "cache"
    monkeypatch.setenv("DEEPDSL_CACHE", str(folder))
    monkeypatch.setenv("DEEPDSL_PTX_CACHE", "1")
    first = nvrtc.ptx(SOURCE, "sm_80")
    (kept,) = folder.glob("ptx-*.ptx")
    kept.write_text("// planted\n")
    os.chmod(kept, 0o666)
    monkeypatch.setattr(nvrtc, "_recent", {})
    assert nvrtc.ptx(SOURCE, "sm_80") == first  # compiled again, not the planted file
    assert compiles == ["sm_80", "sm_80"]


def test_without_the_setting_no_file_is_written(compiles: list[str], monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.setenv("DEEPDSL_CACHE", str(tmp_path / "cache"))
    nvrtc.ptx(SOURCE, "sm_80")
    assert not (tmp_path / "cache").exists()
