"""Download vLLM 0.34.0's source distribution from PyPI and extract the server tests into <work dir>/tests.

The sdist is the file pip resolves for `pip download --no-deps --no-binary :all: vllm==0.34.0`. pip itself is not
used: before saving an sdist, pip prepares its metadata, which installs vLLM's build requirements (torch, cmake, ...)
and runs its setup.py. The file is checked against its published sha256 and kept in <work dir>/downloads.

    python fetch_vllm_tests.py --workdir DIR [--sdist PATH_OR_URL]
"""
import argparse
import hashlib
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

SDIST_NAME = "vllm-0.34.0.tar.gz"
SDIST_URL = ("https://files.pythonhosted.org/packages/92/21/"
             "6e0b077dc4a0b28f5a8ce8bb352a38d7196650d681fd4faa87f8dc622eff/" + SDIST_NAME)
SDIST_SHA256 = "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113"
TOP = "vllm-0.34.0/"
# What is extracted: the OpenAI-server and serve tests, and the package files they import. tests/__init__.py,
# tests/utils.py and tests/conftest.py are the shim's own.
EXTRACT = ["tests/entrypoints/__init__.py", "tests/entrypoints/conftest.py", "tests/entrypoints/openai/",
           "tests/entrypoints/serve/"]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def obtain_sdist(source: str, downloads: Path) -> Path:
    """The sdist in `downloads` (copied from a local path, or downloaded from a URL unless already there and
    intact), checked against SDIST_SHA256."""
    downloads.mkdir(parents=True, exist_ok=True)
    target = downloads / SDIST_NAME
    if not (target.exists() and sha256_of(target) == SDIST_SHA256):
        if Path(source).is_file():
            shutil.copyfile(source, target)
        else:
            print(f"downloading {source}")
            with urllib.request.urlopen(source, timeout=300) as response, open(target, "wb") as f:
                shutil.copyfileobj(response, f)
    actual = sha256_of(target)
    if actual != SDIST_SHA256:
        sys.exit(f"{target}: sha256 {actual}, expected {SDIST_SHA256}")
    return target


def _wanted(member_name: str) -> str | None:
    """The path under the work directory for an sdist member to extract, or None."""
    if not member_name.startswith(TOP):
        return None
    relative = member_name[len(TOP):]
    if any(relative == p or (p.endswith("/") and relative.startswith(p)) for p in EXTRACT):
        return relative
    return None


def extract_tests(sdist: Path, work_dir: Path) -> int:
    """Extract the EXTRACT paths into work_dir (replacing a previous tests/entrypoints); the number of files."""
    shutil.rmtree(work_dir / "tests" / "entrypoints", ignore_errors=True)
    count = 0
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            relative = _wanted(member.name)
            if relative is None or not member.isfile():
                continue
            destination = work_dir / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(destination, "wb") as dst:
                shutil.copyfileobj(src, dst)
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--sdist", default=SDIST_URL, help="a local copy of the sdist, or its URL (default: PyPI)")
    args = parser.parse_args()
    sdist = obtain_sdist(args.sdist, args.workdir / "downloads")
    count = extract_tests(sdist, args.workdir)
    print(f"extracted {count} files of {SDIST_NAME} into {args.workdir / 'tests' / 'entrypoints'}")


if __name__ == "__main__":
    main()
