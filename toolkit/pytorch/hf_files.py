"""Reading a Hugging Face `save_pretrained` directory as untrusted input, for every architecture tk imports.

Weights come from model.safetensors (or its shards inside the directory); a pytorch_model.bin is never unpickled, even
by torch's weights_only loader (alone, it is refused in one line saying to convert it); no code from the directory
runs (each builder makes the model from transformers' own class, whatever config.json names), and
no file outside the directory is read. Whatever would pass export and fail (or translate to nothing) later is refused
here in one line naming the file and the field or tensor: tensors that are not dense floating-point weights or hold
NaN or infinities, shapes other than the config's (checked on a model built on the meta device, before anything is
allocated), names the model does not have, vocabulary ids outside the embedding, SentencePiece models that do not load,
ill-typed generation fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from toolkit.core.declaration import DecodingRules
from toolkit.core.errors import UsageError, first_line

PREFIX = "hf:"
JSON_TYPES = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}
MAX_JSON_BYTES = 16 << 20
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# The ranges of the settings' float fields that have one (a probability); every float field must be finite.
FLOAT_RANGES = {"dropout": (0.0, 1.0)}


def directory_of(source: str | Path) -> Path:
    """The directory of `hf:DIR` (or DIR), refusing anything that is not one."""
    text = str(source)
    directory = Path(text[len(PREFIX):] if text.startswith(PREFIX) else text)
    if not directory.is_dir():
        raise UsageError(f"{directory} is not a directory; `tk export hf:DIR` takes a directory written by save_pretrained "
                         "(a Hub id needs the network: download it first with `hf download ID --local-dir DIR`)")
    return directory


def inside(directory: Path, name: str) -> Path:
    """`name` in `directory`, refusing a name that leaves it and a link that points out of it (a Hub cache's
    snapshot links into its repository's blobs/ folder, which is allowed)."""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise UsageError(f"{directory}: refusing file name {name!r}: a Hugging Face directory may only name files inside it")
    path = directory / name
    root = directory.resolve()
    allowed = [root] + ([root.parent.parent] if root.parent.name == "snapshots" else [])
    real = path.resolve()
    if path.exists() and not any(real.is_relative_to(a) for a in allowed):
        raise UsageError(f"{path} links to {real}, outside the Hugging Face directory; copy the file into it")
    return path


def read_json(directory: Path, name: str, required: bool = True, what: str = "model and tokenizer") -> dict | None:
    """A JSON object of the directory (None when optional and absent)."""
    path = inside(directory, name)
    if not path.is_file():
        if required:
            raise UsageError(f"{directory} has no {name}; give a directory written by save_pretrained ({what})")
        return None
    from toolkit.core.tokenizers import read_json_object

    return read_json_object(path, MAX_JSON_BYTES, "a Hugging Face config")


# The weights of a directory that has only PyTorch's pickle: tk never unpickles a file from outside (even torch's
# weights_only loader runs a pickle machine over it), so it says how to get safetensors instead.
CONVERT_HINT = ("tk never unpickles a file it is given; convert it to safetensors where you trust it (python -c \"from "
                "transformers import AutoModelForSeq2SeqLM as M; M.from_pretrained('DIR').save_pretrained('DIR', "
                "safe_serialization=True)\") or download the model's model.safetensors")


def read_weights(directory: Path, model_class: str) -> tuple[dict[str, torch.Tensor], dict[str, Path], list[Path]]:
    """The state dict, the file each tensor came from, and the files: safetensors, single or sharded (every shard a
    file inside the directory). A pytorch_model.bin is never read: alone, it is refused in one line (CONVERT_HINT);
    beside safetensors, the safetensors are read."""
    from safetensors.torch import load_file

    single, index = inside(directory, "model.safetensors"), inside(directory, "model.safetensors.index.json")
    files: list[Path]
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = (read_json(directory, "model.safetensors.index.json") or {}).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UsageError(f"{index} has no weight_map (tensor name -> shard file); save the model again with save_pretrained")
        files = [inside(directory, name) for name in sorted({str(n) for n in weight_map.values()})]
        absent = next((f for f in files if not f.is_file()), None)
        if absent is not None:
            raise UsageError(f"{index} names shard {absent.name}, which is not in {directory}; download every shard")
    elif inside(directory, "pytorch_model.bin").is_file() or inside(directory, "pytorch_model.bin.index.json").is_file():
        raise UsageError(f"{directory} holds its weights only as pytorch_model.bin, a pickle: {CONVERT_HINT}")
    else:
        raise UsageError(f"{directory} has no model.safetensors; save the model with save_pretrained")
    state: dict[str, torch.Tensor] = {}
    origin: dict[str, Path] = {}
    for f in files:
        try:
            loaded = load_file(str(f))
        except Exception as e:  # a corrupt or truncated file, as one line
            raise UsageError(f"cannot read weights {f}: {first_line(e, 120)}") from None
        for k, v in loaded.items():
            problem = tensor_problem(k, v)
            if problem:
                raise UsageError(f"{f}: {problem}; a {model_class}'s weights are dense floating-point tensors")
            state[k], origin[k] = v, f
    return state, origin, files


def tensor_problem(name: object, value: object) -> str | None:
    """What makes one entry of a weights file unusable as a model weight, or None."""
    if not isinstance(name, str):
        return f"holds the key {name!r:.40}, not a weight name"
    if not isinstance(value, torch.Tensor):
        return f"weight {name} is not a tensor (a Python {type(value).__name__} value)"
    if value.is_meta or value.layout != torch.strided or value.is_quantized:
        kind = "meta" if value.is_meta else "quantized" if value.is_quantized else str(value.layout).removeprefix("torch.")
        return f"weight {name} is a {kind} tensor"
    if value.dtype not in FLOATS:
        return f"weight {name} has dtype {str(value.dtype).removeprefix('torch.')}"
    return None


def meta_shapes(make: Callable[[], torch.nn.Module]) -> dict[str, tuple[int, ...]]:
    """Every state-dict entry of the model `make` builds and its shape, built on the meta device: transformers' own
    layout, with nothing allocated (a config at tk's bounds is a 4 GB model)."""
    with torch.device("meta"):
        hf = make()
    return {k: tuple(v.shape) for k, v in hf.state_dict().items()}


def check_weights(own: dict[str, tuple[int, ...]], optional: set[str], state: dict[str, torch.Tensor],
                  origin: dict[str, Path], directory: Path, model_class: str) -> None:
    """The weights against what the config implies, before anything is built: every name a parameter of this config,
    none missing (but the `optional` ones: tied, or computed at load), each shape the config's, every value finite."""
    unknown = next((k for k in state if k not in own), None)
    if unknown is not None:
        raise UsageError(f"{origin[unknown]}: weight {unknown} is not a {model_class} parameter of this config")
    for k, v in state.items():  # first: a shape says at once when the config and the weights are of other models
        if tuple(v.shape) != own[k]:
            raise UsageError(f"{origin[k]}: weight {k} has shape {tuple(v.shape)}, the config gives {own[k]}")
    missing = next((k for k in own if k not in state and k not in optional), None)
    if missing is not None:
        files = sorted({str(f.name) for f in origin.values()})
        raise UsageError(f"{directory}: weight {missing} is missing from the weights ({', '.join(files) or 'no tensors'})")
    for k, v in state.items():
        if not bool(torch.isfinite(v).all()):
            raise UsageError(f"{origin[k]}: weight {k} holds NaN or infinite values; tk exports a model with finite weights only")


def forbidden(gen: dict, origin: Callable[[str], str]) -> str:
    """The token ids generate never emits, as the settings' suppress_tokens (sorted, comma-separated): bad_words_ids of
    single tokens and suppress_tokens, each a list of JSON whole numbers (a string's characters or a float's truncation
    are never taken for ids)."""
    out = []
    words_ids = gen.get("bad_words_ids") or []
    if not isinstance(words_ids, list) or not all(isinstance(w, list) and all(type(t) is int for t in w) for w in words_ids):
        raise UsageError(f"{origin('bad_words_ids')}: bad_words_ids must be lists of token ids (whole numbers), got {words_ids!r:.40}")
    for words in words_ids:
        if len(words) != 1:
            raise UsageError(f"{origin('bad_words_ids')}: bad_words_ids entry {words} has several tokens; tk forbids single tokens only")
        out.append(words[0])
    suppress = gen.get("suppress_tokens")
    if suppress is not None and (not isinstance(suppress, list) or not all(type(t) is int for t in suppress)):
        raise UsageError(f"{origin('suppress_tokens')}: suppress_tokens must be a list of token ids (whole numbers), "
                         f"got {suppress!r:.40}")
    return ",".join(str(t) for t in sorted({*out, *(suppress or [])}))


def vocabulary(directory: Path, name: str, size: int, field: str) -> dict[str, int]:
    """A vocab.json (piece -> id), every id a token of the model's embedding: an id outside it would pass export and
    fail every translation in the runtime."""
    from toolkit.core.tokenizers import MAX_VOCAB_BYTES, read_json_object

    vocab = read_json_object(inside(directory, name), MAX_VOCAB_BYTES, "a vocabulary")
    for piece, i in vocab.items():
        if type(i) is not int or not 0 <= i < size:
            raise UsageError(f"{directory / name}: piece {piece[:40]!r} has id {i!r:.40}, not a token id of the model "
                             f"(a whole number below config.json {field} {size})")
    return vocab


def sentencepiece(path: Path, hint: str) -> None:
    """A SentencePiece model that loads and encodes (an empty or garbage file would export, then fail every translation)."""
    import sentencepiece as spm

    try:
        data = inside(path.parent, path.name).read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {path} ({e.strerror})") from None
    try:
        sp = spm.SentencePieceProcessor(model_proto=data)
        sp.encode("a")  # an empty proto loads without complaint and fails only here
        usable = sp.get_piece_size() > 0
    except (RuntimeError, TypeError, ValueError):
        usable = False
    if not usable:
        raise UsageError(f"{path} is not a SentencePiece model that sentencepiece can load ({len(data)} bytes); {hint}")


def generation_fields(config: dict, generation: dict) -> dict:
    """The generation settings: config.json's (older models keep them there) under generation_config.json's."""
    keys = ("max_length", "num_beams", "length_penalty", "early_stopping", "bad_words_ids", "suppress_tokens",
            "forced_eos_token_id", "forced_bos_token_id", "decoder_start_token_id")
    return {**{k: config[k] for k in keys if k in config}, **generation}


def beam_rules(gen: dict, origin: Callable[[str], str], forced_end: bool) -> tuple[float, bool | str, int]:
    """(length_penalty, early_stopping, max_new_tokens) of generate's beam rule, each checked."""
    alpha = gen.get("length_penalty", 1.0)
    if type(alpha) not in (int, float) or not -10.0 <= alpha <= 10.0:  # NaN fails the range too
        raise UsageError(f"{origin('length_penalty')}: length_penalty must be a number from -10 to 10, got {alpha!r:.40}")
    max_length = gen.get("max_length", 20)  # transformers' default when neither config sets it
    if type(max_length) is not int or not 2 + forced_end <= max_length <= 4097:
        raise UsageError(f"{origin('max_length')}: max_length must be a whole number from 3 to 4097, got {max_length!r:.40}")
    early = gen.get("early_stopping", False)
    # generate's max_length counts the start token, and a forced end token takes the last place
    return float(alpha), early if early in (True, False, "never") else False, max_length - 1 - forced_end


def config_values(cls: type, config: dict, gen: dict, where: Path, skip: tuple[str, ...],
                  fallback: Callable[[str, dict], object] | None = None) -> dict:
    """The fields of settings class `cls` (a dataclass of JSON scalars with defaults) read from config.json, the
    decoder start from the generation config where it has one, each checked for its type in one line naming it.
    `fallback(name, config)`: a field's value when config.json lacks it or gives null (None: the class's default)."""
    from dataclasses import fields

    defaults = cls()
    values = {}
    for f in fields(cls):
        if f.name in skip:
            continue
        given = fallback(f.name, config) if fallback and config.get(f.name) is None else None
        value = given if given is not None else config.get(f.name, getattr(defaults, f.name))
        if f.name == "decoder_start_token_id":
            value = gen.get("decoder_start_token_id", value)
        if f.name == "eos_token_id" and isinstance(value, list):
            value = value[0] if len(value) == 1 else value
        kind = type(getattr(defaults, f.name))
        if kind is float and type(value) is int:
            value = float(value) if abs(value) < 2**1024 else math.inf  # a whole number past a float's range
        if type(value) is not kind:
            raise UsageError(f"{where}/config.json: {f.name} must be {JSON_TYPES[kind]}, got {value!r:.40}")
        if kind is float:
            _check_float(f.name, value, where)
        values[f.name] = value
    return values


def _check_float(name: str, value: float, where: Path) -> None:
    """A float field is finite (Python's json reads NaN, Infinity and 1e400 from config.json; torch fails on them
    later, or exports a model that translates to nothing) and within its range where it has one."""
    if not math.isfinite(value):
        raise UsageError(f"{where}/config.json: {name} must be a finite number, got {value!r}")
    low, high = FLOAT_RANGES.get(name, (-math.inf, math.inf))
    if not low <= value <= high:
        raise UsageError(f"{where}/config.json: {name} must be a number from {low:g} to {high:g}, got {value!r:.40}")


def check_sizes(settings: object, where: str, target_vocab: int, vocab_name: str = "vocabulary") -> None:
    """Refuses, before anything is allocated, settings tk cannot build: sizes within the bounds tk builds
    (toolkit.core.architectures.SIZES), special and suppressed token ids inside the target vocabulary."""
    from dataclasses import asdict

    from toolkit.core.architectures import SIZES
    from toolkit.core.manifest import size_problem

    for key, value in asdict(settings).items():
        problem = size_problem(key, value) if key in SIZES else None
        if problem:
            raise UsageError(f"{where}: {problem}")
    for t in [settings.pad_token_id, settings.eos_token_id, settings.decoder_start_token_id, *settings.suppressed()]:
        if not 0 <= t < target_vocab:
            raise UsageError(f"{where}: token id {t} is outside the {vocab_name} of {target_vocab}")


def end_rules(settings: object, config: dict, gen: dict, origin: Callable[[str], str], where: Path) -> DecodingRules:
    """generate's rules for these settings: its end token (forced at the limit when the configs force it), the
    Hugging Face length penalty and early stopping, its default output limit."""
    forced = gen.get("forced_eos_token_id", config.get("forced_eos_token_id"))
    if forced not in (None, settings.eos_token_id):
        raise UsageError(f"{where}: forced_eos_token_id {forced} is not the end token {settings.eos_token_id}")
    alpha, early, max_new = beam_rules(gen, origin, forced is not None)
    return DecodingRules(start=settings.decoder_start_token_id, end=settings.eos_token_id, pad=settings.pad_token_id,
                         length_penalty="hf", alpha=alpha, early_stopping=early, forced_end=forced is not None,
                         max_new_tokens=max_new)
