"""``Generate``: text generated from fixed prompts with the current weights, every interval, as Composer's."""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcomposer.callbacks._current_model import is_torch_model, write_torch_weights
from jaxcomposer.core import adapters
from jaxcomposer.core.events import Callback, Event
from jaxcomposer.core.time import Time, TimeUnit

__all__ = ["Generate", "NATIVE_KWARGS", "generate_tokens"]

# what the native decoder takes of Hugging Face's ``generate`` keywords
NATIVE_KWARGS = ("max_new_tokens", "max_length", "do_sample", "temperature", "top_k", "eos_token_id", "seed")
HF_MAX_LENGTH = 20  # Hugging Face's default max_length (prompt included) when no length is given


class Generate(Callback):
    """Composer's ``Generate(prompts, interval, batch_size=None, **kwargs)`` for causal language models: at every
    ``interval`` and at the end of training, generates a continuation of each prompt with the current weights and
    logs the table ``generations`` (columns ``prompt``, ``generation``).

    ``prompts``: strings (encoded with the tokenizer) or lists of token ids. ``tokenizer`` may be given among the
    keywords (any object with ``encode(text) -> ids`` and ``decode(ids)``, a Hugging Face tokenizer included);
    otherwise ``state.model.tokenizer`` is used (a ``HuggingFaceModel``'s). Without a tokenizer, prompts must be
    ids and the generations are ids. ``batch_size`` prompts are generated together (default: all).
    ``interval``: an int counts epochs; ``'Nba'``, ``'Nep'``, ``'Nsp'``, ``'Ntok'`` or ``'Xdur'``.

    The model:

    - a torch ``HuggingFaceModel`` (Composer's only case): its ``model.generate(input_ids, attention_mask,
      **kwargs)`` with every keyword as given, prompts left-padded, after the run's current weights are written
      into the module (the Trainer writes them only at the end of fit; in between they live in the train state);
    - an NNX module called as ``module(tokens, train=False) -> logits (B, T, V)`` (``jaxcomposer.models.GPT``): a
      compiled decoding loop over a fixed length with the current weights (no key/value cache: each new token
      runs the model over the whole padded sequence, which causal attention keeps from seeing the padding). It takes
      Hugging Face's ``max_new_tokens``, ``max_length`` (prompt included; default 20 when neither is given),
      ``do_sample`` (default greedy), ``temperature`` (1.0), ``top_k`` (50 when sampling, as Hugging Face; 0 or
      None: all), ``eos_token_id`` (a row that produced it stops there) and ``seed`` (sampling key; default the
      run's seed, folded with the batch number); other keywords are refused at INIT. A model with a ``seq_len``
      must fit the longest prompt plus the new tokens in it.

    Where the generations go: ``logger.log_table(columns, rows, name='generations')`` when the logger has that
    method, ``<run_dir>/generations/ba<batch>.json`` when the Trainer has a ``run_dir``, and the attributes
    ``generations`` (the latest rows) and ``generated_ids`` (the latest new token ids, one list per prompt).
    """

    def __init__(self, prompts: Sequence[str] | Sequence[Sequence[int]], interval: int | str | Time,
                 batch_size: int | None = None, **kwargs: Any):
        prompts = list(prompts) if isinstance(prompts, (list, tuple)) else None
        if not prompts or not all(isinstance(p, str) or (isinstance(p, (list, tuple)) and p and
                                                         all(_is_int(t) for t in p)) for p in prompts):
            raise ValueError("Generate: prompts must be a non-empty list of strings or of non-empty token id lists")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"Generate: batch_size must be None or an int >= 1, got {batch_size!r}")
        self.prompts = prompts
        self.tokenizer = kwargs.pop("tokenizer", None)
        self.generate_kwargs = kwargs
        self.batch_size = batch_size if batch_size is not None else len(prompts)
        self.interval = _parse_interval(interval)
        self.last_generate_batch: int | None = None
        self.generations: list[list[Any]] = []
        self.generated_ids: list[list[int]] = []
        self._last_count = 0  # the sample/token/duration count at the previous batch end (crossing intervals)

    # ---- when ----
    def run_event(self, event: Event, state, logger) -> None:
        if event == Event.INIT:
            self._check(state)
        elif event == Event.FIT_START:
            self._last_count = self._count(state)
        if state.max_duration is not None and self._due(event, state) and \
                self.last_generate_batch != state.timestamp.batch:
            self.generate(state, logger)
        super().run_event(event, state, logger)

    def _count(self, state):
        unit = self.interval.unit
        if unit == TimeUnit.DURATION:
            return state.elapsed_fraction()
        return int(state.timestamp.get(unit).value) if unit in (TimeUnit.SAMPLE, TimeUnit.TOKEN) else 0

    def _due(self, event: Event, state) -> bool:
        if event == Event.FIT_END:
            return True
        unit, n, ts = self.interval.unit, self.interval.value, state.timestamp
        if unit == TimeUnit.EPOCH:
            return event == Event.EPOCH_END and ts.epoch % n == 0
        if event != Event.BATCH_END:
            return False
        if unit == TimeUnit.BATCH:
            return ts.batch % n == 0
        before, self._last_count = self._last_count, self._count(state)
        return math.floor(self._last_count / n) > math.floor(before / n)

    # ---- checks, before training ----
    def _tokenizer(self, state):
        return self.tokenizer if self.tokenizer is not None else getattr(state.model, "tokenizer", None)

    def _check(self, state) -> None:
        model = state.model
        if any(isinstance(p, str) for p in self.prompts) and self._tokenizer(state) is None:
            raise ValueError("Generate: the prompts are strings and there is no tokenizer to encode them; pass "
                             "tokenizer=... (or a HuggingFaceModel with one), or give the prompts as token id lists")
        if is_torch_model(model):
            if not callable(getattr(getattr(model, "model", None), "generate", None)):
                raise ValueError(f"Generate: a torch model must be a HuggingFaceModel around a Hugging Face model "
                                 f"with generate(), got {type(model).__name__}")
            return
        if not isinstance(model, nnx.Module):
            raise TypeError(f"Generate: expected a HuggingFaceModel or an NNX causal language model, got "
                            f"{type(model).__name__}")
        unknown = sorted(set(self.generate_kwargs) - set(NATIVE_KWARGS))
        if unknown:
            raise ValueError(f"Generate: {unknown} are not taken by the NNX decoder (it takes {list(NATIVE_KWARGS)})")
        seq_len = getattr(model, "seq_len", None)
        longest = max(len(ids) for ids in self._encode(state))
        total = longest + self._new_tokens(longest)
        if isinstance(seq_len, int) and total > seq_len:
            raise ValueError(f"Generate: the longest prompt ({longest} tokens) plus the new tokens make {total}, more "
                             f"than the model's seq_len={seq_len}; lower max_new_tokens/max_length")

    def _encode(self, state) -> list[list[int]]:
        tokenizer = self._tokenizer(state)
        return [list(tokenizer.encode(p)) if isinstance(p, str) else [int(t) for t in p] for p in self.prompts]

    def _new_tokens(self, longest: int) -> int:
        kw = self.generate_kwargs
        if kw.get("max_new_tokens") is not None:
            return int(kw["max_new_tokens"])
        return max(int(kw.get("max_length") or HF_MAX_LENGTH) - longest, 0)

    # ---- generating ----
    def generate(self, state, logger) -> None:
        self.last_generate_batch = state.timestamp.batch
        prompts = self._encode(state)
        chunks = [prompts[i:i + self.batch_size] for i in range(0, len(prompts), self.batch_size)]
        if is_torch_model(state.model):
            new_ids = [ids for chunk in chunks for ids in self._generate_hf(state, chunk)]
        else:
            new_ids = [ids for chunk in chunks for ids in self._generate_native(state, chunk)]
        tokenizer = self._tokenizer(state)
        rows = [[prompt, _decode(tokenizer, ids) if tokenizer is not None else ids]
                for prompt, ids in zip(self.prompts, new_ids)]
        self.generations, self.generated_ids = rows, new_ids
        log_table = getattr(logger, "log_table", None)
        if callable(log_table):
            log_table(columns=["prompt", "generation"], rows=rows, name="generations")
        if state.run_dir is not None:
            path = Path(state.run_dir) / "generations" / f"ba{int(state.timestamp.batch)}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"columns": ["prompt", "generation"],
                                        "rows": [[_jsonable(p), _jsonable(g)] for p, g in rows]}, indent=1))

    def _generate_native(self, state, prompts: list[list[int]]) -> list[list[int]]:
        kw = self.generate_kwargs
        longest = max(map(len, prompts))
        steps = self._new_tokens(longest)
        tokens = np.zeros((len(prompts), longest + steps), np.int32)
        for row, ids in enumerate(prompts):
            tokens[row, :len(ids)] = ids
        lengths = np.array([len(ids) for ids in prompts], np.int32)
        do_sample = bool(kw.get("do_sample", False))
        top_k = kw.get("top_k", 50) if do_sample else None
        eos = kw.get("eos_token_id")
        seed = kw.get("seed", state.seed if state.seed is not None else 0)
        key = jax.random.fold_in(jax.random.PRNGKey(int(seed)), int(state.timestamp.batch))
        graphdef, _, _ = nnx.split(state.model, nnx.Param, ...)
        ts = state.train_state
        out = np.asarray(generate_tokens(graphdef, ts.params, ts.model_state, tokens, lengths, steps=steps,
                                         do_sample=do_sample, temperature=float(kw.get("temperature", 1.0)),
                                         top_k=int(top_k or 0), eos_token_id=-1 if eos is None else int(eos),
                                         key=key))
        # (read back before returning: the next step donates the train state's buffers)
        return [_until_eos(out[row, n:n + steps].tolist(), eos) for row, n in enumerate(lengths)]

    def _generate_hf(self, state, prompts: list[list[int]]) -> list[list[int]]:
        generate = adapters.model_adapter(state.model).functional["generate"]  # torch_bridge's
        return generate(write_torch_weights(state), prompts, self._tokenizer(state), self.generate_kwargs)


@functools.partial(jax.jit, static_argnames=("graphdef", "steps", "do_sample", "top_k"))
def generate_tokens(graphdef, params, rest, tokens, lengths, *, steps: int, do_sample: bool, temperature: float,
                    top_k: int, eos_token_id: int, key):
    """Fill ``tokens`` (B, L) after each row's ``lengths`` prompt tokens with ``steps`` new ones, decoded by the
    module ``nnx.merge(graphdef, params, rest)`` in eval mode: greedy (argmax, first maximum on ties) or sampled
    from ``softmax(logits / temperature)`` over the ``top_k`` largest (all when 0). A row that produces
    ``eos_token_id`` (-1: none) fills the rest with it, as Hugging Face pads finished rows."""
    model = nnx.merge(graphdef, params, rest)
    rows = jnp.arange(tokens.shape[0])

    def step(i, carry):
        tokens, done = carry
        pos = lengths - 1 + i  # each row's last filled column
        logits = model(tokens, train=False)[rows, pos].astype(jnp.float32)
        if do_sample:
            logits = logits / temperature
            if top_k:
                kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
                logits = jnp.where(logits < kth, -jnp.inf, logits)
            nxt = jax.random.categorical(jax.random.fold_in(key, i), logits)
        else:
            nxt = jnp.argmax(logits, axis=-1)
        nxt = jnp.where(done, eos_token_id, nxt).astype(tokens.dtype)
        return tokens.at[rows, pos + 1].set(nxt), done | (nxt == eos_token_id)

    tokens, _ = jax.lax.fori_loop(0, steps, step, (tokens, jnp.zeros(tokens.shape[:1], bool)))
    return tokens


def _parse_interval(interval: Any) -> Time:
    if isinstance(interval, bool) or not isinstance(interval, (int, str, Time)):
        raise ValueError(f"Generate: interval must be an int of epochs, a Time or a time string such as '100ba', got "
                         f"{interval!r}")
    t = Time(interval, TimeUnit.EPOCH) if isinstance(interval, int) else \
        Time.from_timestring(interval) if isinstance(interval, str) else interval
    units = (TimeUnit.EPOCH, TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN, TimeUnit.DURATION)
    if t.unit not in units or t.value <= 0:
        raise ValueError(f"Generate: interval must be positive, in {[u.value for u in units]}, got {interval!r}")
    return t


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _until_eos(ids: list[int], eos: int | None) -> list[int]:
    return ids[:ids.index(eos) + 1] if eos is not None and eos in ids else ids


def _decode(tokenizer, ids: list[int]) -> str:
    try:
        return tokenizer.decode(ids, skip_special_tokens=True)
    except TypeError:  # a plain tokenizer without Hugging Face's keyword
        return tokenizer.decode(ids)


def _jsonable(x: Any) -> Any:
    return x if isinstance(x, str) else [int(t) for t in x]
