"""Two nodes on one machine, for real: two `pardiag profile` launchers with `--nnodes 2
--node-rank 0/1`, each in its own UTS namespace with its own host name (`unshare --uts`, as
root). Where network namespaces and a rate limit (`tc ... tbf`) can be set up, each node also
gets its own network namespace, joined to the other by a veth pair limited to 20 Mbit/s
(`tests/netns.py`): ranks of one node talk over its loopback, ranks of different nodes over the
slow link, as on a cluster. Otherwise both nodes share this machine's network and the test says
so.

The job is examples/train_2d.py with its mesh ordered (tp, dp) (`--tp-outer`): its TP groups
span the two nodes and its DP groups stay inside one — the placement pardiag's placement rule
corrects.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from .netns import Network, profile_command, run_two_nodes, uts_refused
from .paths import REPO

#: Every test here starts a training job.
pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "examples" / "train_2d.py"
#: TP's activations dwarf FSDP's parameters: TP traffic is what crosses the nodes
SCRIPT_ARGS = ["--steps", "5", "--tp-outer", "--width", "64", "--layers", "1", "--batch", "64",
               "--seq", "32"]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    why = uts_refused()
    if why:
        pytest.skip(why)
    net = Network(rate_mbit=20)
    out = tmp_path_factory.mktemp("multinode") / "run"
    try:
        codes, results = run_two_nodes(net, profile_command(EXAMPLE, 2, out, *SCRIPT_ARGS),
                                       cwd=REPO)
    finally:
        net.close()
    return out, codes, results, net


def test_each_node_writes_its_ranks_and_its_part(two_nodes):
    out, codes, results, _ = two_nodes
    assert codes == [0, 0], [r[1][-2000:] for r in results]
    assert sorted(p.name for p in out.glob("rank*.trace.json.gz")) == [
        f"rank{r}.trace.json.gz" for r in range(4)]
    side = out / "pardiag"
    assert (side / "run.json").is_file() and (side / "run.node1.json").is_file()
    parts = [json.loads((side / n).read_text()) for n in ("run.json", "run.node1.json")]
    assert [p["node_rank"] for p in parts] == [0, 1]
    assert [p["nodes"] for p in parts] == [{"node0": [0, 1]}, {"node1": [2, 3]}]
    assert all(p["world_size"] == 4 and p["nnodes"] == 2 and p["exit_code"] == 0 for p in parts)
    for r in range(4):
        meta = json.loads((side / f"rank{r}.meta.json").read_text())
        assert meta["host"] == f"node{r // 2}" and meta["node_rank"] == r // 2
    # each launcher ends with the next command, and torch's profiler lines are not shown
    for _, err in results:
        assert f"pardiag: next: {sys.executable} -m pardiag report" in err
        assert "USDT:" not in err and err.count("CPUAllocator.cpp") <= 1


def test_report_shows_two_nodes_and_the_placement(two_nodes, tmp_path):
    out, codes, _, net = two_nodes
    assert codes == [0, 0]
    js = tmp_path / "r.json"
    res = subprocess.run([sys.executable, "-m", "pardiag", "report", str(out), "-o",
                          str(tmp_path / "r.html"), "--json", str(js), "-q"],
                         capture_output=True, text=True, timeout=240, cwd=REPO)
    assert res.returncode == 0, res.stderr
    rep = json.loads(js.read_text())
    assert rep["run"]["nodes"] == {"node0": [0, 1], "node1": [2, 3]}
    groups = {(g["dim"], tuple(g["ranks"])): g["spans_nodes"] for g in rep["layout"]["groups"]}
    assert groups[("tp", (0, 2))] is True and groups[("tp", (1, 3))] is True
    assert groups[("dp", (0, 1))] is False and groups[("dp", (2, 3))] is False
    bw = rep["sync"]["bandwidth"]
    tp_pgs = {g["pg"] for g in rep["layout"]["groups"] if g["dim"] == "tp"}
    dp_pgs = {g["pg"] for g in rep["layout"]["groups"] if g["dim"] == "dp"}
    assert {b["inter_node"] for b in bw if b["pg"] in tp_pgs} == {"inter"}
    assert {b["inter_node"] for b in bw if b["pg"] in dp_pgs} == {"intra"}
    every = rep["recommendations"] + rep["not_recommended"]
    placement = [r for r in every if r["kind"] == "placement"]
    assert [r["title"] for r in placement] == ["Keep TP inside a node"]
    if not net.ok:
        pytest.skip(f"2 nodes shown, TP across them evaluated; the nodes share this machine's "
                    f"network ({net.why}), so no slower link between them to recommend against")
    # over the 20 Mbit/s link TP's collectives are slower than DP's inside a node
    med = {}
    for pgs, name in ((tp_pgs, "tp"), (dp_pgs, "dp")):
        vals = sorted(b["busbw_gbps"] for b in bw if b["pg"] in pgs and b["busbw_gbps"])
        med[name] = vals[len(vals) // 2]
    assert med["tp"] < med["dp"], med
    p = placement[0]
    assert p["predicted_step_us"] < p["measured_step_us"], p["evidence"]
    # recommended, unless this run's step noise is larger than the predicted gain (a loaded
    # machine): then it is held back for that reason only
    if p not in rep["recommendations"]:
        assert p["gain_pct"] < rep["min_gain_pct"] and not p["ruled_out"], p


def test_node_local_folders_are_joined(two_nodes, tmp_path):
    """Each node's own folder (no shared file system): report joins them; one alone is
    analysed with a warning that names the missing node."""
    out, codes, _, _ = two_nodes
    assert codes == [0, 0]
    folders = [tmp_path / "node0", tmp_path / "node1"]
    for node, d in enumerate(folders):
        (d / "pardiag").mkdir(parents=True)
        for r in (2 * node, 2 * node + 1):
            shutil.copy(out / f"rank{r}.trace.json.gz", d)
            for kind in ("meta", "comms"):
                shutil.copy(out / "pardiag" / f"rank{r}.{kind}.json", d / "pardiag")
        part = "run.json" if node == 0 else "run.node1.json"
        shutil.copy(out / "pardiag" / part, d / "pardiag")
    from pardiag.analyzer.trace import load_traces
    both = load_traces(folders)
    assert sorted(both.ranks) == [0, 1, 2, 3]
    assert both.run_info.nodes == {"node0": [0, 1], "node1": [2, 3]}
    assert both.run_info.missing_nodes == []
    assert not [w for w in both.warnings if "node(s)" in w]
    alone = load_traces(folders[:1])
    assert sorted(alone.ranks) == [0, 1]
    assert alone.run_info.missing_nodes == [1]
    warn = [w for w in alone.warnings if "no part of node(s) [1]" in w]
    assert warn and "pardiag/run.node1.json" in warn[0], alone.warnings
    assert any("no trace for rank(s) [2, 3]" in w for w in alone.warnings)
