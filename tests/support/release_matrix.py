"""`make test-matrix`: the release-sensitive tests against every transformers minor release, lower bound to newest.

The whole release-sensitive set (`TESTS`) runs on the lowest supported release and on the one before the newest (the
newest gets the whole suite from `make test`); the releases between get `SMOKE`, what decides behaviour by release.
A release between changes what the two around it do not only through what the compatibility table asks of it, so
the smoke catches what the full set would, at a quarter of the time; `--full` runs the whole set on every release.

The releases are read from the package index when this runs (never written down here), so the next CI run after a
new transformers release tests it with no change to the project. One venv (build/venv-matrix) is reused; only
transformers (and whatever its own requirements move) is swapped between releases. Each release prints one line,
`transformers 5.21.1: 512 passed`, and the run fails if any release fails.

    python tests/support/release_matrix.py --torch torch==2.13.0 [--releases 5.17.0 5.24.0] [--full]
        [--skip-installed-in .venv] [--seed-from .venv] [--model-tests-ran-on-lowest]
"""

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / "build" / "venv-matrix"
# What can break between releases: the modeling API (cache, masks, outputs, attention and experts interfaces), the
# generation loop, pipelines, loading, saving and remote code, converters against transformers' own classes, PEFT's
# wrapping, tensor/expert parallel plans, export (transformers' static-cache export wrapper, ONNX, GGUF loading), and
# the compatibility table. The Trainer-facing tests (test_trainer_features,
# test_train, test_hub's local Hub server) are written against the newest releases' API and run in the full suite.
TESTS = [
    "tests/test_compat.py",
    "tests/test_config.py",
    "tests/test_modeling.py",
    "tests/test_block_options.py",
    "tests/test_parity.py",
    "tests/test_generation.py",
    "tests/test_host_sync.py",
    "tests/test_save_load.py",
    "tests/test_encoder_decoder.py",
    "tests/test_t5_bart_parity.py",
    "tests/test_moe.py",
    "tests/test_vocab_padding.py",
    "tests/test_peft.py",
    "tests/test_tensor_parallel.py",
    "tests/test_encoder.py",
    "tests/test_heads.py",
    "tests/test_bad_input.py",
    "tests/test_fused_loss.py",
    "tests/test_packing.py",
    "tests/test_upcycle.py",
    "tests/test_checkpoints.py",
    "tests/test_card.py",
    "tests/test_export.py",
    "tests/test_quantization.py",
    *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_convert_*.py")),
]
# On the releases between those two, what decides behaviour by release: the compatibility table's probes (every
# version decision and transformers internal hf_tfm touches) and the parity, generation and save/load tests of each
# paradigm against transformers' own classes.
SMOKE = [
    "tests/test_compat.py",
    "tests/test_parity.py",
    "tests/test_save_load.py",
    "tests/test_t5_bart_parity.py",
]
EXTRA = ".[test]"  # the extras the tests import (PEFT, datasets, tokenizers, pytest)


def makefile_list(name: str) -> list[str]:
    """The words of the Makefile's `NAME := ...` (continued lines included): its one definition."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(rf"^{name} := (.*)$", text, re.MULTILINE)
    if match is None:
        raise SystemExit(f"Makefile: no `{name} :=` line")
    return match.group(1).split()


# what `make test-min` runs on the lowest supported release (with the lowest core packages too)
MODEL_TESTS = makefile_list("MODEL_TESTS")
XDIST = makefile_list("XDIST")  # the suite's workers and how tests are spread over them
UV_INSTALL = makefile_list("UV_INSTALL")  # `python UV_INSTALL --python python REQUIREMENTS`


def supported_range() -> tuple[tuple[int, ...], int]:
    """pyproject.toml's `transformers>=LOWER,<UPPER` as (lower version, upper major)."""
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'"transformers>=([\d.]+),<(\d+)"', text)
    if match is None:
        raise SystemExit("pyproject.toml: no `transformers>=X,<Y` requirement found")
    return parse(match.group(1)), int(match.group(2))


def parse(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def index_releases(python: Path) -> list[str]:
    """Every transformers release the package index offers now, as `pip index versions` lists them."""
    result = subprocess.run(
        [str(python), "-m", "pip", "index", "versions", "transformers"], capture_output=True, text=True, check=True
    )
    match = re.search(r"Available versions: (.+)", result.stdout)
    if match is None:
        raise SystemExit(f"pip index versions transformers printed no versions:\n{result.stdout}{result.stderr}")
    return [v.strip() for v in match.group(1).split(",")]


def newest_patch_per_minor(releases: list[str], lower: tuple[int, ...], upper_major: int) -> list[str]:
    """Final releases (no rc/dev) from `lower` up to the upper major, the newest patch of each minor, oldest first."""
    final = [parse(v) for v in releases if re.fullmatch(r"\d+\.\d+\.\d+", v)]
    chosen: dict[tuple[int, int], tuple[int, ...]] = {}
    for version in final:
        minor = version[:2]
        if lower[:2] <= minor and version[0] < upper_major and (minor not in chosen or version > chosen[minor]):
            chosen[minor] = version
    return [".".join(map(str, chosen[minor])) for minor in sorted(chosen)]


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], cwd=ROOT, text=True, **kwargs)


def make_venv(torch_requirement: str, seed: Path | None = None) -> Path:
    """The matrix venv: a copy of `seed` (a venv with the same extras installed: CI's .venv, which `make test` has
    just built, so nothing is downloaded twice), or a new one. Its packages come from uv, as the Makefile's venvs'."""
    python = VENV / "bin" / "python"
    if not python.exists() and seed is not None and (seed / "bin" / "python").exists():
        run(["cp", "-a", seed, VENV], check=True)  # its scripts keep the seed's path; this runs `python -m` alone
    if not python.exists():
        run([sys.executable, "-m", "venv", VENV], check=True)
        run([python, "-m", "pip", "install", "-q", torch_requirement], check=True)
    if not (VENV / "bin" / "uv").exists():
        run([python, "-m", "pip", "install", "-q", "uv"], check=True)
    run(uv_install(python, "-e", EXTRA), check=True)  # a reused venv gets extras added since
    return python


def uv_install(python: Path, *requirements: str) -> list:
    """The Makefile's `uv_install`: `requirements` installed into `python`'s venv, compiled as pip compiles."""
    return [python, *UV_INSTALL, "--python", python, *requirements]


def install_release(python: Path, release: str) -> subprocess.CompletedProcess:
    """transformers `release` swapped into the matrix venv."""
    return run(uv_install(python, f"transformers=={release}"), capture_output=True)


def installed_transformers(python: Path) -> str:
    """The version installed, from its metadata (importing transformers would take seconds)."""
    result = run(
        [python, "-c", "from importlib.metadata import version; print(version('transformers'))"], capture_output=True
    )
    return result.stdout.strip()


def full_releases(releases: list[str]) -> set[str]:
    """The releases the whole set runs on: the lowest, and the newest but one."""
    return {releases[0], *releases[-2:-1]}


def test_release(python: Path, release: str, tests: list[str]) -> tuple[bool, str]:
    """Install `release` in the matrix venv and run `tests`; (passed, pytest's closing counts)."""
    install = install_release(python, release)
    if install.returncode != 0:
        return False, "install failed: " + install.stderr.strip().splitlines()[-1]
    if installed_transformers(python) != release:
        return False, f"installed {installed_transformers(python)!r} instead"
    tests = run(
        [python, "-m", "pytest", *XDIST, "-q", "-p", "no:cacheprovider", *tests],
        capture_output=True,
    )
    lines = [line for line in tests.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else "no output"
    if tests.returncode != 0:
        failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
        print("\n".join(failures[:30]), file=sys.stderr)
    return tests.returncode == 0, re.sub(r" in [\d.]+s.*", "", summary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default="torch", help="the torch requirement for the venv (make passes the pin)")
    parser.add_argument("--releases", nargs="+", help="test these releases instead of those the index offers")
    parser.add_argument("--full", action="store_true", help="the whole release-sensitive set on every release")
    parser.add_argument("--seed-from", type=Path, help="a venv to copy when the matrix venv does not exist yet")
    parser.add_argument(
        "--model-tests-ran-on-lowest",
        action="store_true",
        help="`make test-min` has just run the Makefile's MODEL_TESTS on the lowest release (CI): run the rest there",
    )
    parser.add_argument(
        "--skip-installed-in",
        type=Path,
        help="a venv whose transformers the full suite has just tested (CI's .venv): that release is not rerun",
    )
    args = parser.parse_args(argv)
    python = make_venv(args.torch, args.seed_from)
    lower, upper_major = supported_range()
    releases = args.releases or newest_patch_per_minor(index_releases(python), lower, upper_major)
    skipped = None
    if args.skip_installed_in is not None:
        skipped = installed_transformers(args.skip_installed_in / "bin" / "python")
    print(f"transformers releases >= {'.'.join(map(str, lower))}, < {upper_major}: {', '.join(releases)}", flush=True)
    results = {}
    for release in releases:
        if release == skipped:
            print(f"transformers {release}: the full suite ran on it (make test)", flush=True)
            continue
        started = time.time()
        full = args.full or release in full_releases(releases)
        tests = TESTS if full else SMOKE
        if release == releases[0] and args.model_tests_ran_on_lowest:
            tests = [test for test in tests if test not in MODEL_TESTS]
        passed, summary = test_release(python, release, tests)
        results[release] = passed
        tier = "release-sensitive set" if full else "smoke"
        print(f"transformers {release} ({tier}): {summary} ({time.time() - started:.0f} s)", flush=True)
    failed = [release for release, passed in results.items() if not passed]
    if failed:
        print(f"FAILED on transformers {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
