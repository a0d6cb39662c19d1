"""Rebuild `qwen3.5-tokenizer-small.json.gz` from the released Qwen3.5 tokenizer.json:
python tests/data/build_qwen_tokenizer.py PATH/TO/tokenizer.json

The small file is the real one cut down to the tokens that the repository's texts (the string
literals of the tests and of the package, its prompts among them; samples/; the docs) are made of: the same normalizer, pre-tokenizer, decoder,
special tokens and ids, and the same ids for every word of those texts. `tests/qwen_tokenizer.py`
fills the ids left out, so that the vocabulary has the real size.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import sys
from pathlib import Path

import tokenizers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from qwen_tokenizer import SMALL as OUT  # noqa: E402
from qwen_tokenizer import completed  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# llama.cpp's converter names the pre-tokenizer by the hash of this text's ids (conversion/base.py)
LLAMA_CPP_CHECK_TEXT = (
    '\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated'
    ') ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作131415'
    '1天～ ------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\''
    "s there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)


def repository_texts() -> list[str]:
    texts = [p.read_text(encoding="utf-8") for p in [*REPO.glob("samples/*.txt"), *REPO.glob("samples/*.md"),
                                                      *REPO.glob("docs/*.md"), REPO / "README.md"]]
    for source in [*(REPO / "tests").rglob("*.py"), *(REPO / "summarize").rglob("*.py")]:  # prompts are literals
        tree = ast.parse(source.read_text(encoding="utf-8"))
        texts += [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    return [LLAMA_CPP_CHECK_TEXT, *(text for text in texts if _utf8(text))]


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, written to test a bad input
        return False
    return True


def with_words_alone(texts: list[str]) -> list[str]:
    """The texts, and each run of letters in them alone and after a space: a word keeps its ids
    wherever a test puts it."""
    return texts + [w for text in texts for run in re.findall(r"[^\W\d_]+", text) for w in (run, " " + run)]


def main(real: Path) -> None:
    spec = json.loads(real.read_text(encoding="utf-8"))
    raw = tokenizers.Tokenizer.from_file(str(real))
    texts = repository_texts()
    vocab = spec["model"]["vocab"]
    kept = {token for token in vocab if len(token) == 1}  # every byte
    for encoding in raw.encode_batch(with_words_alone(texts), add_special_tokens=False):
        kept |= {token for token in encoding.tokens if token in vocab}  # the added tokens are kept apart
    made_by: dict[str, list[tuple[str, str]]] = {}
    for left, right in spec["model"]["merges"]:
        made_by.setdefault(left + right, []).append((left, right))
    todo = list(kept)
    while todo:  # every merge that makes a kept token, and what it is made of
        for left, right in made_by.get(todo.pop(), []):
            for part in (left, right):
                if part not in kept:
                    kept.add(part)
                    todo.append(part)
    spec["model"]["vocab"] = {token: i for token, i in vocab.items() if token in kept}
    spec["model"]["merges"] = [m for m in spec["model"]["merges"] if m[0] in kept and m[1] in kept and m[0] + m[1] in kept]
    packed = json.dumps(spec, ensure_ascii=False, separators=(",", ":"))
    small = tokenizers.Tokenizer.from_str(json.dumps(completed(json.loads(packed))))
    assert small.get_vocab_size() == raw.get_vocab_size()
    for text in texts:
        assert small.encode(text, add_special_tokens=False).ids == raw.encode(text, add_special_tokens=False).ids, text
    OUT.write_bytes(gzip.compress(packed.encode(), mtime=0))
    print(f"{OUT}: {len(spec['model']['vocab'])} tokens, {len(spec['model']['merges'])} merges, "
          f"{OUT.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
