"""`encdec batch` on a two-node `ray.cluster_utils.Cluster` on this machine (one CPU per node,
two actors at half a CPU each): 50 documents and 20 clips, each once, with the offline `LLM`'s
results, computed on both nodes."""
from __future__ import annotations

from collections import Counter

import pytest

from encdec.entrypoints.cli import main
from tests.ray.conftest import SMALL_CACHE, SUMMARY_TOKENS, init_ray, read_results

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def node_ids() -> set[str]:
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    for _ in range(2):
        cluster.add_node(num_cpus=1, include_dashboard=False)
    cluster.wait_for_nodes()
    init_ray(address=cluster.address)
    yield {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    ray.shutdown()
    cluster.shutdown()


def test_two_nodes(node_ids):
    assert len(node_ids) == 2


def test_summarize_on_both_nodes(node_ids, tiny_bart_dir, documents_jsonl, offline_summaries, tmp_path):
    assert main(["batch", "summarize", str(documents_jsonl), "--model", str(tiny_bart_dir),
                 "--output", str(tmp_path), "--replicas", "2", "--batch-size", "4", "--temperature", "0",
                 "--max-tokens", str(SUMMARY_TOKENS), *SMALL_CACHE]) == 0
    rows = read_results(tmp_path)
    assert Counter(r["id"] for r in rows) == Counter(list(offline_summaries))
    assert {r["id"]: r["summary"] for r in rows} == offline_summaries
    assert {r["node_id"] for r in rows} == node_ids


@pytest.mark.extended
def test_transcribe_on_both_nodes(node_ids, clip_paths, offline_transcripts, tmp_path):
    assert main(["batch", "transcribe", *clip_paths, "--output", str(tmp_path), "--replicas", "2",
                 "--batch-size", "2", "--output-format", "txt", *SMALL_CACHE]) == 0
    rows = read_results(tmp_path)
    assert Counter(r["id"] for r in rows) == Counter(clip_paths)
    assert {r["id"]: r["text"] for r in rows} == offline_transcripts
    assert all(r["error"] is None and r["language"] == "en" and r["segments"] for r in rows)
    assert {r["node_id"] for r in rows} == node_ids
    assert sorted(p.stem for p in tmp_path.glob("*.txt")) == [f"clip{i:02d}" for i in range(20)]
