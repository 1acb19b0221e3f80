"""The documentation: the configuration reference is the schema's, and the site builds strict (no broken link)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vla_edge_ros.tools.config_reference import reference

ROOT = Path(__file__).resolve().parents[1]


def test_the_configuration_reference_is_the_schema_written_out():
    """Regenerate with: python -m vla_edge_ros.tools.config_reference > docs/reference/configuration.md"""
    assert (ROOT / "docs" / "reference" / "configuration.md").read_text() == reference()


def test_the_reference_names_every_parameter_with_its_range_and_liveness():
    page = reference()
    assert "| `deadline_ms` | `33.0` | [1, 1000] | **yes** |" in page
    assert "| `kv.policy` |" in page and "`fifo`, `cosine`, `aura`, `dms`" in page
    assert "| `model_dir` | `\"models/sim\"` | path | no |" in page


def test_the_readme_links_only_to_files_that_exist():
    text = (ROOT / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t and not t.startswith("#")]
    assert targets and all((ROOT / t).exists() for t in targets), [t for t in targets if not (ROOT / t).exists()]


def test_the_site_builds_strict(tmp_path):
    """mkdocs --strict turns a broken link, a page missing from the nav or an unknown anchor into an error."""
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]'; make setup installs it)")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()


def test_the_readme_opens_with_the_two_commands_and_stays_short():
    """The README is the front page: `make run` and `make test` first, the rest in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    first = [line.split("#")[0].strip() for line in lines[:6] if line.startswith("make ")]
    assert first == ["make run", "make test"], lines[:6]
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move detail to a page under docs/"
