"""The Trajectories page on the files the demo wrote: a real model's trajectories, as it saw them."""

from __future__ import annotations

import orjson

from tests.support.demo import QuickDemo
from tests.support.server import running_server, server_config


def test_the_demos_trajectories_are_coloured_by_their_response_mask(quick_demo: QuickDemo, open_page) -> None:
    from trainer_client.backends.models import resolve_model_path

    assert quick_demo.done.returncode == 0, quick_demo.done.stdout + quick_demo.done.stderr
    runs = quick_demo.out_dir
    workbench = {"runs_dir": str(runs), "tokenizer": str(resolve_model_path("smollm2"))}
    shown_both = False
    with running_server(server_config(workbench=workbench)) as srv:
        page, _ = open_page(srv.url + "/ui/")
        for task in ("search_qa", "arithmetic", "bank"):
            written = [orjson.loads(line) for line in (runs / f"{task}.jsonl").read_bytes().splitlines()]
            for line, record in enumerate(written):
                page.goto(f"{srv.url}/ui/#/trajectories/{task}.jsonl/{line}")
                tokens = f"[data-trajectory] [data-line='{line}'] [data-tokens=per-token] .tok"
                page.wait_for_selector(tokens, state="attached")  # a token of only whitespace has no box
                shown = page.eval_on_selector_all(
                    tokens,
                    "els => els.map(e => [Number(e.dataset.mask), e.classList.contains('model') ? 1 : 0])",
                )
                mask = record["response_mask"]
                assert [m for m, _ in shown] == mask and [c for _, c in shown] == mask, (task, line)
                texts = page.eval_on_selector_all(tokens, "els => els.map(e => e.textContent)")
                assert "".join(texts) == "".join(s["text"] for s in record["segments"]), (task, line)
                shown_both = shown_both or (0 in mask and 1 in mask)
    # the demo's model calls a tool in at least one trajectory: both colours were checked
    assert shown_both
