"""When a new memory updates an older one ("my dog is now called Max" after "my dog is called Bob").

The older entry is kept and marked superseded, never deleted: a wrong guess costs one marker line, while
a deleted fact would be lost. So the rule is conservative. A new entry supersedes an older one when
- the new one says it is an update ("now", "no longer", "changed", "moved", 现在, 不再, 改成, 换成, 搬到 …)
  and at least half of the older entry's words (for Chinese, Japanese and Korean, its characters) are in it,
  two at least; or
- both say the same thing with different numbers ("locker 217" → "locker 305"): the same words, two at
  least, and different numbers.
"""

from __future__ import annotations

import re

from picoclaw import cjk
from picoclaw.memory.terms import CJK_STOP_CHARS, terms

_UPDATE = re.compile(r"\b(?:now|no longer|not any ?more|anymore|changed|moved|switched|instead|new)\b"
                     r"|现在|不再|改成|改为|换成|换了|搬到|搬去|已经换|新的", re.IGNORECASE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def _words(text: str) -> set[str]:
    """Latin words (stop words dropped) and single CJK characters (common ones dropped), numbers left out.

    Japanese and Korean count by the character as Chinese does: "62キロ" and "217번" are a number and its
    unit, as "62公斤" is, not a word of their own that would make the same fact look different."""
    latin = {term for term in terms(text) if not cjk.has_cjk(term) and not term.isdigit()}
    characters = {ch for ch in cjk.letters(text) if ch not in CJK_STOP_CHARS}
    return latin | characters


def supersedes(new: str, old: str) -> bool:
    """Whether the entry text `new` updates the older entry text `old` (see the module's rule)."""
    old_words, new_words = _words(old), _words(new)
    shared = old_words & new_words
    if len(shared) < 2:
        return False
    if _UPDATE.search(new) and len(shared) * 2 >= len(old_words):
        return True
    return old_words == new_words and set(_NUMBER.findall(old)) != set(_NUMBER.findall(new))
