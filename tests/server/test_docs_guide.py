"""The tool author's guide works as written: its example module, served by a real server."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import httpx

from protocol import decode_results
from tests.support.server import REPO, running_server

GUIDE = REPO / "docs" / "writing-tools.md"


def files_in_guide(text: str) -> dict[str, str]:
    """Code blocks whose first line is ``# file: NAME``."""
    blocks = re.findall(r"^(`{3,})\w*\n# file: (\S+)\n(.*?)^\1$", text, re.MULTILINE | re.DOTALL)
    return {name: body for _, name, body in blocks}


def test_the_guides_example_module_serves_tools_sessions_and_a_verifier(tmp_path: Path):
    files = files_in_guide(GUIDE.read_text())
    assert set(files) == {"inventory_tools.py", "shop.yaml"}
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    with running_server(tmp_path / "shop.yaml", env={"PYTHONPATH": str(tmp_path)}) as srv:

        def calls(*items: dict) -> list:
            response = httpx.post(srv.url + "/v1/calls", json={"calls": list(items)}, timeout=30)
            return decode_results(response.content)

        def call(name: str, session: str | None = None, **arguments) -> dict:
            return {"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}

        listed = {
            t["name"]: t for t in httpx.get(srv.url + "/v1/tools", params={"toolset": "shop"}).json()["tools"]
        }
        assert set(listed) == {"price", "add_to_cart", "checkout"}
        assert listed["price"]["inputSchema"]["properties"]["currency"]["enum"] == ["EUR", "USD"]
        assert (
            listed["add_to_cart"]["inputSchema"]["properties"]["quantity"]["description"]
            == "How many (1 or more)."
        )

        apple, usd, unknown, typo = calls(
            call("price", item="apple"),
            call("price", item="bread", currency="USD"),
            call("price", item="caviar"),
            call("price", itme="apple"),
        )
        assert apple.structured == {"item": "apple", "price": 0.5, "currency": "EUR"}
        assert usd.structured["price"] == 2.48
        assert unknown.error.kind == "invalid_arguments" and "caviar" in unknown.error.message
        assert typo.error.kind == "invalid_arguments" and "itme" in typo.error.message

        session = f"traj-{uuid.uuid4().hex}"
        _, _, paid = calls(
            call("add_to_cart", session, item="apple", quantity=2),
            call("add_to_cart", session, item="milk"),
            call("checkout", session),
        )
        assert paid.structured == {"paid": 2.1}
        request = {"verifier": "paid_exactly", "response": "done", "ground_truth": 2.1, "session": session}
        verified = httpx.post(srv.url + "/v1/verify", json={"requests": [request]}).json()["results"][0]
        assert verified["score"] == 1.0 and verified["details"] == {"paid": 2.1}

        assert httpx.delete(f"{srv.url}/v1/sessions/{session}").status_code == 200
        deadline = time.monotonic() + 10
        while f"cart of {session} released" not in srv.output and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"cart of {session} released" in srv.output
