"""Generate in real (tiny) runs: the ids it produces at each interval are greedy argmax decoding, computed here by
hand with the model's forward and the weights of that batch; for the native GPT and for a Hugging Face GPT-2."""
import json

import jax
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import Trainer
from jaxcomposer.callbacks import Generate
from jaxcomposer.callbacks.generate import generate_tokens
from jaxcomposer.core.events import Callback
from jaxcomposer.data import ArrayLoader, lm_arrays
from jaxcomposer.models import GPT
from jaxcomposer.models.tasks import ComposerCausalLM
from jaxcomposer.optim import DecoupledSGDW

VOCAB = 16


def gpt():
    return GPT(VOCAB, seq_len=16, d_model=16, n_layers=1, n_heads=2, rngs=nnx.Rngs(0))


def lm_loader():
    tokens = np.random.default_rng(0).integers(0, VOCAB, 8 * 9 + 1)
    return ArrayLoader(lm_arrays(tokens, 8), 4, shuffle=False)  # 2 batches per epoch


class Letters:
    """A tokenizer of the letters a..p, one id each."""

    def encode(self, text):
        return [ord(c) - ord("a") for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + i) for i in ids)


def greedy_by_hand(module, params, prompt, n):
    """Greedy decoding one token at a time, each from a forward over the prompt and the tokens so far."""
    graphdef, _, rest = nnx.split(module, nnx.Param, ...)
    model = nnx.merge(graphdef, params, rest)
    ids = list(prompt)
    for _ in range(n):
        logits = np.asarray(model(np.array([ids], np.int32), train=False))
        ids.append(int(np.argmax(logits[0, -1])))
    return ids[len(prompt):]


class Snapshots(Callback):
    """After the Generate callbacks (later in the list): each generation with the weights it was made with."""

    def __init__(self, gens):
        self.gens, self.seen = gens, []

    def _take(self, state):
        for gen in self.gens:
            if gen.last_generate_batch == state.timestamp.batch and \
                    (not self.seen or self.seen[-1][0] != state.timestamp.batch):
                params = jax.tree.map(np.array, state.train_state.params)
                self.seen.append((state.timestamp.batch, params, [g.generated_ids for g in self.gens],
                                  [g.generations for g in self.gens]))

    def batch_end(self, state, logger):
        self._take(state)

    def fit_end(self, state, logger):
        self._take(state)


def test_native_generations_are_greedy_decoding_with_the_weights_of_their_batch(tmp_path):
    prompts = [[1, 2, 3], [4, 5]]  # of different lengths: each row continues after its own prompt
    greedy = Generate(prompts, interval="2ba", max_new_tokens=5)
    top1 = Generate(prompts, interval="2ba", max_new_tokens=5, do_sample=True, top_k=1, temperature=0.7)
    text = Generate(["abc", "ponm"], interval="2ba", tokenizer=Letters(), max_length=8)
    snaps = Snapshots([greedy, top1, text])
    module = gpt()
    Trainer(model=ComposerCausalLM(module), train_dataloader=lm_loader(), max_duration="4ba", seed=0,
            run_dir=tmp_path, progress_bar=False, optimizers=DecoupledSGDW(lr=1.0),
            callbacks=[greedy, top1, text, snaps]).fit()

    assert [batch for batch, *_ in snaps.seen] == [2, 4]  # not again at FIT_END (batch 4 is done)
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(snaps.seen[0][1]),
                                                        jax.tree.leaves(snaps.seen[1][1])))
    for batch, params, (greedy_ids, top1_ids, text_ids), (_, _, text_rows) in snaps.seen:
        expected = [greedy_by_hand(module, params, p, 5) for p in prompts]
        assert greedy_ids == expected, batch
        assert top1_ids == expected, batch  # sampling from the single most likely token is greedy
        # max_length counts the prompt: 8 - 4 (the longest prompt) new tokens for each
        expected_text = [greedy_by_hand(module, params, Letters().encode(p), 4) for p in ("abc", "ponm")]
        assert text_ids == expected_text
        assert text_rows == [["abc", Letters().decode(expected_text[0])], ["ponm", Letters().decode(expected_text[1])]]
        written = json.loads((tmp_path / "generations" / f"ba{batch}.json").read_text())
        assert written == {"columns": ["prompt", "generation"], "rows": text_rows}


def test_eos_stops_a_row_and_the_rest_is_filled_with_it():
    module = gpt()
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    tokens = np.zeros((1, 9), np.int32)
    tokens[0, :3] = [1, 2, 3]
    run = lambda eos: np.asarray(generate_tokens(graphdef, params, rest, tokens, np.array([3], np.int32), steps=6,
                                                 do_sample=False, temperature=1.0, top_k=0, eos_token_id=eos,
                                                 key=jax.random.PRNGKey(0)))[0, 3:].tolist()
    free = run(-1)
    assert free == greedy_by_hand(module, params, [1, 2, 3], 6)
    eos = free[1]
    stop = free.index(eos)
    assert run(eos) == free[:stop + 1] + [eos] * (5 - stop)


def test_generate_checks_its_arguments_before_training():
    with pytest.raises(ValueError, match="prompts"):
        Generate([], interval="1ba")
    with pytest.raises(ValueError, match="interval"):
        Generate([[1]], interval="10sec")
    with pytest.raises(ValueError, match="batch_size"):
        Generate([[1]], interval=1, batch_size=0)
    cases = [(Generate(["abc"], interval=1), "no tokenizer"),
             (Generate([[1, 2]], interval=1, num_beams=4), r"\['num_beams'\] are not taken"),
             (Generate([[1, 2]], interval=1, max_new_tokens=15), "more than the model's seq_len=16")]
    for gen, message in cases:
        with pytest.raises(ValueError, match=message):
            Trainer(model=ComposerCausalLM(gpt()), train_dataloader=lm_loader(), max_duration="1ba",
                    progress_bar=False, callbacks=[gen])


def test_hugging_face_generations_use_the_weights_of_their_batch():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.data import DataLoader

    from jaxcomposer.models import HuggingFaceModel

    config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                                     eos_token_id=None)  # no end token: every row makes all its tokens
    torch.manual_seed(0)
    model = HuggingFaceModel(transformers.GPT2LMHeadModel(config))
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 32, (8, 8)))
    rows = [{"input_ids": ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": ids[i]}
            for i in range(8)]
    prompts = [[1, 2, 3], [4, 5, 6]]
    gen = Generate(prompts, interval="1ba", max_new_tokens=4, do_sample=False)
    snaps = Snapshots([gen])
    Trainer(model=model, train_dataloader=DataLoader(rows, batch_size=4), max_duration="2ba", seed=0,
            progress_bar=False, optimizers=DecoupledSGDW(model.parameters(), lr=1.0), callbacks=[gen, snaps]).fit()

    assert [batch for batch, *_ in snaps.seen] == [1, 2]
    reference = transformers.GPT2LMHeadModel(config).eval()
    for batch, params, (generated,), _ in snaps.seen:
        # the run names the weights after the exported forward around the HuggingFaceModel around GPT-2
        weights = {name.removeprefix("model.model."): torch.from_numpy(value) for name, value in params.items()}
        missing, unexpected = reference.load_state_dict(weights, strict=False)
        assert unexpected == [] and set(missing) <= {"lm_head.weight"}  # tied to the token embedding
        expected = []
        for prompt in prompts:
            seq = list(prompt)
            with torch.no_grad():
                for _ in range(4):
                    seq.append(int(reference(torch.tensor([seq])).logits[0, -1].argmax()))
            expected.append(seq[len(prompt):])
        assert generated == expected, batch
