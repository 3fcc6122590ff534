import os
import sys
from pathlib import Path

# The repository's tests/ folder importable (factories for the runtime's spec path).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")
