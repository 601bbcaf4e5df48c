"""A two-turn chat with the dsv4 Python package (`pip install .`, or PYTHONPATH=python beside a
build): load a checkpoint, render each user turn in DeepSeek-V4's prompt format, generate the reply
and continue the same sequence with the next turn (only the tokens it does not hold yet run).

    python3 examples/chat.py MODEL_DIR [TOKENIZER_JSON]

The tokenizer defaults to MODEL_DIR/tokenizer.json; without one the turns are token ids (a
checkpoint with random weights has no text to speak of). examples/chat.c is the same in C."""
import os
import sys

import dsv4

REPLY_TOKENS = 16


def chat_text(engine, seq, tok):
    """The whole conversation rendered each turn; the sequence is cut back to the longest prefix it
    shares with the rendering (exactly) and the rest is run."""
    messages = []
    for turn in ("Hello! Who are you?", "Say that again, shorter."):
        messages.append({"role": "user", "content": turn})
        ids = tok.encode_chat(messages)
        held = engine.seq_tokens(seq)
        k = 0
        while k < len(held) and k < len(ids) - 1 and held[k] == ids[k]:
            k += 1
        if k < len(held):
            engine.seq_truncate(seq, k)
        out, _, _ = engine.generate(ids[k:], REPLY_TOKENS, stop_at_eos=True, seq=seq)
        # the reply's exact bytes (random weights can stop inside a UTF-8 character)
        reply = tok.decode_bytes(out, skip_special=True)
        sys.stdout.buffer.write(f"user: {turn}\nassistant: ".encode() + reply + b"\n")
        sys.stdout.flush()
        messages.append({"role": "assistant", "content": reply})


def chat_ids(engine, seq):
    """Each turn a few ids; the second starts with the last token of the first reply (a generation
    returns it without feeding it to the caches)."""
    out = []
    for t in range(2):
        prompt = ([int(out[-1])] if t else []) + [(17 * t + 5 * i + 3) % engine.vocab for i in range(4)]
        out, _, _ = engine.generate(prompt, REPLY_TOKENS, stop_at_eos=True, seq=seq)
        print(f"turn {t + 1}: {len(prompt)} ids in, reply: {' '.join(str(int(x)) for x in out)}")
        if len(out) == 0:
            return
    print(f"sequence holds {engine.seq_length(seq)} tokens")


def main(argv):
    if len(argv) not in (2, 3):
        print(f"usage: chat.py MODEL_DIR [TOKENIZER_JSON]   (dsv4 {dsv4.__version__})", file=sys.stderr)
        return 2
    tok_path = argv[2] if len(argv) == 3 else os.path.join(argv[1], "tokenizer.json")
    with dsv4.Engine(argv[1]) as engine:
        seq = engine.seq_create()
        if os.path.exists(tok_path):
            chat_text(engine, seq, dsv4.Tokenizer(tok_path))
        else:
            chat_ids(engine, seq)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
