"""Where the tests find the checkout's files and the material beside it."""

from pathlib import Path

#: The checkout's root.
REPO = Path(__file__).resolve().parent.parent
#: The committed sample runs.
SAMPLES = REPO / "sample_traces"
#: The example training scripts.
EXAMPLES = REPO / "examples"
#: Real GPU traces recorded by others, beside the checkout (read by path, never copied).
SHARED_TRACES = REPO.parent / "shared" / "real_traces"
#: Small inputs reproducing public bug reports, each with its expect.json, beside the checkout.
REPROS = REPO.parent / "shared" / "repros"
