"""`config.tuned.pbtxt`: the user's config.pbtxt with only the tuned fields replaced.

The user's file is never rewritten. The tuned file keeps its text, comments and layout, except
the top-level fields tune chose (`max_batch_size`, `dynamic_batching`, `instance_group`, the
`intra_op_thread_count` entry of `parameters`): those are replaced where they stand, or added at
the end. Fields are located with protobuf's own text-format tokenizer (comments and strings are
its business), and the result is parsed back with text_format and compared to the intended
ModelConfig; if they differ (an unusual layout), the whole config is written by text_format
instead, without the original comments, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from google.protobuf.message import Message

from ..repository.model_config import ModelConfig, parse_config_text

TUNED_FILENAME = "config.tuned.pbtxt"
_OPEN = {"{": "}", "<": ">", "[": "]"}


@dataclass(frozen=True)
class FieldSpan:
    """A top-level field of a text-format message: its name and [start, end) offsets."""

    name: str
    start: int
    end: int


class _Positions:
    def __init__(self, text: str) -> None:
        self.lines = text.split("\n")
        self.starts: list[int] = []
        offset = 0
        for line in self.lines:
            self.starts.append(offset)
            offset += len(line) + 1

    def offset(self, line: int, column: int) -> int:
        return self.starts[line] + column


def _at(tokenizer: text_format.Tokenizer) -> tuple[int, int]:
    # The tokenizer keeps the current token's line and column (0-based) in these attributes.
    return tokenizer._line, tokenizer._column  # noqa: SLF001


def top_level_fields(text: str) -> list[FieldSpan]:
    """Every top-level field of a text-format message, in order."""
    positions = _Positions(text)
    tokenizer = text_format.Tokenizer(positions.lines)
    spans: list[FieldSpan] = []
    while not tokenizer.AtEnd():
        line, column = _at(tokenizer)
        start = positions.offset(line, column)
        name = tokenizer.token
        tokenizer.NextToken()
        if tokenizer.token == ":":
            tokenizer.NextToken()
        end = _skip_value(tokenizer, positions)
        if tokenizer.token in (",", ";"):
            line, column = _at(tokenizer)
            end = positions.offset(line, column) + 1
            tokenizer.NextToken()
        spans.append(FieldSpan(name, start, end))
    return spans


def _skip_value(tokenizer: text_format.Tokenizer, positions: _Positions) -> int:
    """Consume one value (scalar, message or list); returns the offset just after it."""
    if tokenizer.token in _OPEN:
        depth = 0
        while True:
            token = tokenizer.token
            if not token:
                raise ValueError("unbalanced brackets in config text")
            line, column = _at(tokenizer)
            if token in _OPEN:
                depth += 1
            elif token in ("}", ">", "]"):
                depth -= 1
            tokenizer.NextToken()
            if depth == 0:
                return positions.offset(line, column) + 1
    line, column = _at(tokenizer)
    end = positions.offset(line, column) + len(tokenizer.token)
    was_string = tokenizer.token[:1] in ("'", '"')
    tokenizer.NextToken()
    while was_string and tokenizer.token[:1] in ("'", '"'):  # adjacent strings concatenate
        line, column = _at(tokenizer)
        end = positions.offset(line, column) + len(tokenizer.token)
        tokenizer.NextToken()
    return end


def _field_text(config: Message, name: str, key: str | None = None) -> str:
    """The text-format lines of one top-level field of `config` (one map entry for `key`)."""
    only = ModelConfig()
    if name == "parameters":
        only.parameters[key].CopyFrom(config.parameters[key])
    elif name == "instance_group":
        only.instance_group.extend(config.instance_group)
    else:
        field = config.DESCRIPTOR.fields_by_name[name]
        if field.message_type is not None:
            getattr(only, name).CopyFrom(getattr(config, name))
        else:
            setattr(only, name, getattr(config, name))
    return text_format.MessageToString(only).rstrip("\n")


def _parameter_key(snippet: str) -> str | None:
    try:
        parsed = parse_config_text(snippet)
    except Exception:
        return None
    keys = list(parsed.parameters)
    return keys[0] if len(keys) == 1 else None


@dataclass
class TunedText:
    text: str
    kept_comments: bool  # False: written whole by text_format (the layout could not be kept)


def tuned_text(original: str, tuned: Message, fields: list[str], parameter_keys: list[str], header: str) -> TunedText:
    """`original` with `fields` (top-level field names) and the `parameters` entries of
    `parameter_keys` replaced by their values in `tuned` (removed where `tuned` has none)."""
    spans = top_level_fields(original) if original.strip() else []
    replacements: list[tuple[int, int, str]] = []
    missing: list[str] = []
    for name in fields:
        matching = [s for s in spans if s.name == name]
        present = (len(getattr(tuned, name)) > 0) if name == "instance_group" else (
            tuned.HasField(name) if tuned.DESCRIPTOR.fields_by_name[name].message_type is not None
            else True)
        new = _field_text(tuned, name) if present else ""
        if matching:
            replacements.append((matching[0].start, matching[0].end, new))
            replacements.extend((s.start, s.end, "") for s in matching[1:])
        elif new:
            missing.append(new)
    for key in parameter_keys:
        new = _field_text(tuned, "parameters", key) if key in tuned.parameters else ""  # absent: removed
        matching = [s for s in spans if s.name == "parameters" and _parameter_key(original[s.start:s.end]) == key]
        if matching:
            replacements.append((matching[0].start, matching[0].end, new))
        elif new:
            missing.append(new)
    text = original
    for start, end, new in sorted(replacements, reverse=True):
        text = text[:start] + new + text[end:]
    if missing:
        text = text.rstrip("\n") + ("\n" if text.strip() else "") + "\n".join(missing) + "\n"
    if not text.endswith("\n"):
        text += "\n"
    result = header + text
    try:
        kept = parse_config_text(result) == tuned
    except Exception:
        kept = False
    if not kept:
        result = header + text_format.MessageToString(tuned)
    return TunedText(result, kept)


def write_tuned(model_dir: Path, tuned: Message, fields: list[str], parameter_keys: list[str], header: str) -> tuple[Path, bool]:
    """Write config.tuned.pbtxt beside the model's config.pbtxt (never touching that file)."""
    original_path = model_dir / "config.pbtxt"
    original = original_path.read_text(encoding="utf-8") if original_path.is_file() else ""
    result = tuned_text(original, tuned, fields, parameter_keys, header)
    target = model_dir / TUNED_FILENAME
    target.write_text(result.text, encoding="utf-8")
    return target, result.kept_comments
