"""Fixtures of the unit tests: inventories written to a temporary directory.

Tests chdir into that directory and pass the file's bare name, so errors read exactly as a
user sees them (``lab.yaml:14: worker.hosts...``).
"""
from __future__ import annotations

import pathlib
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
INVENTORIES = REPO / "inventories"

# `plan --json` as the issue specifies it (extra keys are allowed).
PLAN_SCHEMA = {
    "type": "object",
    "required": ["cluster", "tasks"],
    "properties": {
        "cluster": {
            "type": "object",
            "propertyNames": {"enum": ["chief", "ps", "worker"]},
            "additionalProperties": {"type": "array", "items": {"type": "string", "pattern": r"^[^:]+:\d+$"}},
        },
        "tasks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["role", "index", "host", "address", "port", "cuda_visible_devices", "tf_config",
                             "argv"],
                "properties": {
                    "role": {"enum": ["chief", "ps", "worker", "evaluator"]},
                    "index": {"type": "integer", "minimum": 0},
                    "host": {"type": "string"},
                    "address": {"type": "string"},
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "cuda_visible_devices": {"type": ["string", "null"]},
                    "tf_config": {"type": "object", "required": ["cluster", "task"]},
                    "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                },
            },
        },
    },
}


@pytest.fixture
def write_inventory(tmp_path, monkeypatch):
    """``write_inventory(text, name="lab.yaml") -> "lab.yaml"`` (relative to the cwd, tmp_path)."""
    monkeypatch.chdir(tmp_path)

    def write(text: str, name: str = "lab.yaml") -> str:
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return name

    return write
