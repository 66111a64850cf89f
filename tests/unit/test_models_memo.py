"""`serves_model`'s memo answers as the globs do, and stays bounded."""

from __future__ import annotations

from fnmatch import fnmatchcase

import shared.models as models


def test_the_memo_answers_as_the_globs_do_and_is_bounded() -> None:
    globs = ("claude-*", "o[0-9]*")
    for n in range(models.MEMO_MAX * 2 + 5):
        model = f"claude-{n}" if n % 3 else f"o{n}x" if n % 2 else f"gpt-{n}"
        assert models.serves_model(model, globs) == any(fnmatchcase(model, g) for g in globs)
        assert len(models._memo) <= models.MEMO_MAX
    assert models.serves_model("claude-x", ["claude-*"]) and not models.serves_model("gpt-5", ["claude-*"])
