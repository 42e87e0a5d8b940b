"""Issue 9.3: vlmtrain vs Bridge's pretrain() alone on the identical ConfigContainer.

    python benchmarks/overhead.py [--case SUBSTR] [--pairs 2] [--iterations 20] [--pool K] [--dry-run]

The code is vlmtrain.observe.bench.overhead (its docstring, or --help, says the rest).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmtrain.observe.bench.overhead import main  # noqa: E402
from vlmtrain.report import profile  # noqa: E402


def profile_summary(run_dir: Path) -> dict | None:
    """A side's traced step (vlmtrain.report.profile), None when it traced none."""
    return profile.summarize(run_dir) if (run_dir / profile.TRACE).exists() else None


if __name__ == "__main__":
    sys.exit(main(profile_summary=profile_summary))
