"""Checks shared by the model tests whose peer is a transformers model (RWKV-4 and Mamba): the same training step,
the same checkpoint files, the same greedy continuation."""
import contextlib

import torch

from kernels.testing import FP32_BUDGET, assert_close


def tokens(seed, batch, length, vocab):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def make_models(peer, our_class, our_config, randomize, seed):
    """(peer in eval mode, a copy of its state dict taken before it ever runs, our model loaded from it)."""
    peer = randomize(peer, seed)
    state_dict = {k: v.detach().clone() for k, v in peer.state_dict().items()}
    ours = our_class(our_config)
    ours.load_checkpoint(state_dict)
    return peer.eval(), state_dict, ours.eval()


def check_training_step(peer, ours, ids, labels):
    """Loss (labels shifted inside, -100 ignored) and the gradient of every parameter, against the peer."""
    peer.train()
    ours.train()
    theirs, mine = peer(ids, labels=labels, use_cache=False), ours(ids, labels=labels)
    assert_close(mine.loss, theirs.loss, FP32_BUDGET, "loss")
    theirs.loss.backward()
    mine.loss.backward()
    peer_grads = dict(peer.named_parameters())
    for name, p in ours.named_parameters():
        assert_close(p.grad, peer_grads[name].grad, FP32_BUDGET, f"gradient of {name}")


def check_checkpoint_round_trip(writer, peer, state_dict, ours, classes, base_attr, tmp_path, ids):
    """Write a checkpoint directory with ``writer`` (ours, the peer's save_pretrained, or config + torch.save),
    read it back with our causal-LM and base classes, and (for our files) with the peer's class.
    classes: (our causal-LM class, our base class, the peer's causal-LM class); base_attr: the causal LM's
    attribute that holds the base model (its checkpoint prefix)."""
    lm_class, base_class, peer_class = classes
    if writer == "ours":
        ours.save_pretrained(tmp_path)
    elif writer == "peer":
        peer.save_pretrained(tmp_path)
    else:
        peer.config.save_pretrained(tmp_path)
        torch.save(state_dict, tmp_path / "pytorch_model.bin")
    with torch.no_grad():
        expected = ours(ids)
        assert torch.equal(lm_class.from_pretrained(tmp_path)(ids).logits, expected.logits)
        assert torch.equal(base_class.from_pretrained(tmp_path)(ids).last_hidden_state,
                           getattr(ours, base_attr)(ids).last_hidden_state)
        if writer == "ours":                                        # and the peer reads what we wrote
            theirs = peer_class.from_pretrained(tmp_path).eval()
            assert_close(theirs(ids).logits, expected.logits, FP32_BUDGET, "peer reading our checkpoint")


def peer_greedy(peer, prompt, steps):
    """The peer's greedy continuation, re-reading the whole sequence for every new token (no state involved)."""
    ids = prompt
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, peer(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@contextlib.contextmanager
def input_lengths(module):
    """The sequence length of every call of ``module`` inside the block: [prompt length, 1, 1, ...] when
    generation reads the prompt once and then one token per step."""
    lengths = []
    hook = module.register_forward_pre_hook(lambda _, args: lengths.append(args[0].shape[1]))
    try:
        yield lengths
    finally:
        hook.remove()
