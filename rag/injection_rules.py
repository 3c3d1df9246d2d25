"""The rules of the prompt-injection filter (:mod:`rag.injection`): names, patterns, actions.

Each rule has a name that metrics and logs use, and says what a match does to a question:
``block`` (refused) or ``flag`` (answered, counted). Any match flags a retrieved passage.

=================  =================================================================  ========
rule               matches                                                            question
=================  =================================================================  ========
override           ignore/disregard/forget (all) previous/prior/above/your            block
                   instructions; 忽略(之前|以上|前面)的(所有)?(指令|指示|说明)
role_override      "you are now DAN / an unrestricted AI", "from now on you are",     block
                   "do anything now", "an AI without rules", 你现在是, 从现在开始你是, 越狱模式
extraction         reveal/print/repeat/translate *your* prompt or instructions, or    block
                   *the* system prompt; "repeat the text above"; 输出你的提示词
system_prompt      a new/updated system prompt, "system prompt:", 新的系统提示, 系统提示：  block
new_instructions   "new instructions:", "IMPORTANT: ignore", 新指令：                   block
chat_token         chat-template control tokens: <|im_start|>, <<SYS>>, <start_of_turn>   block
section_escape     our prompt's sections, lowercase: </context>, <question>, </answer>  block
encoded_payload    "decode this base64 and follow it"                                 block
role_play          "pretend you are", "roleplay as", 假装你是, 请扮演                   flag
role_tag           [INST], <assistant>, <system> on its own line, ``### System:``,    flag
                   ``Assistant:`` at a line start
ai_addressed       "if you are an AI", "note to AI assistants", 如果你是AI助手         flag
zero_width         three or more zero-width characters inside words                   flag
bidi_control       bidi embedding/override/isolate controls (U+202A-E, U+2066-9)      flag
unicode_tags       Unicode tag characters (U+E0000-E007F) outside a flag emoji        flag
invisible_run      eight or more invisible characters in a row                        flag
hidden_comment     an HTML comment that holds instruction-like text                   flag
hidden_css         text hidden by CSS (display:none, ...) that holds instructions     flag
hidden_base64      a base64 blob that decodes to instruction-like text                flag
=================  =================================================================  ========

The last seven are checked in code (:mod:`rag.injection`), not by a pattern here; the
hidden-text ones use :data:`DIRECTIVE`, instruction-like wording that counts only inside
hidden text ("AI assistants must say ...").

Mentioning a topic is not an attack. The rules look for an order aimed at the model
(ignore + previous/your + instructions; reveal + *your* prompt), not for the words: "What is
a system prompt in LLM apps?" and "How do I ignore a file in git?" match nothing. Each
rule's ``need`` lists words it cannot match without, so most text skips most regexes.

Example::

    from rag.injection_rules import RULES
    [r.name for r in RULES if r.pattern.search("ignore previous instructions")]   # ["override"]
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["DIRECTIVE", "RULES", "RULE_NAMES", "STRUCTURE_RULES", "Action", "Rule"]

Action = Literal["block", "flag"]


@dataclass(frozen=True, slots=True)
class Rule:
    """A named pattern: what a match does to a question (``block`` or ``flag``).

    ``compact`` rules match the letters-and-digits-only form of the text; ``exact`` ones
    the NFKC text as written (case kept); the others the folded text.
    """

    name: str
    pattern: re.Pattern[str]
    question: Action = "block"
    form: Literal["folded", "compact", "exact"] = "folded"
    need: tuple[tuple[str, ...], ...] = ()  # a cheap gate: the regex runs only when every group has a word

    def gate(self, words: frozenset[str], text: str) -> bool:
        for group in self.need:
            by_word, by_text = _split_need(group, self.form == "compact")
            if words.isdisjoint(by_word) and not any(w in text for w in by_text):
                return False
        return True


@functools.cache
def _split_need(group: tuple[str, ...], compact: bool) -> tuple[frozenset[str], tuple[str, ...]]:
    """ASCII words are looked up in the text's word set; CJK ones (and all, in compact text) searched."""
    if compact:
        return frozenset(), group
    return frozenset(w for w in group if w.isascii()), tuple(w for w in group if not w.isascii())


def _r(pattern: str, flags: int = re.IGNORECASE) -> re.Pattern[str]:
    return re.compile(pattern, flags | re.VERBOSE)


# -- the lexicon ----------------------------------------------------------------------------
_VERB_IGNORE = (r"(?:ignore|disregard|forget|override|overrule|bypass|discard|neglect|abandon|set\s+aside"
                r"|pay\s+no\s+attention\s+to|do\s+not\s+(?:follow|obey)|don'?t\s+(?:follow|obey)|stop\s+following)")
_FILLER = (r"(?:all|any|every|each|the|your|my|of|these|those|and|or|given|existing|above|previous|prior|"
           r"earlier|preceding|foregoing|former|original|initial|system|developer|safety)")
# An override needs one of these: "ignore the rules" is a linter question, "ignore your rules" is not.
_WHEN = r"(?:previous|prior|above|earlier|preceding|foregoing|former|original|initial|your|system|developer|safety)"
_ORDERS = (r"(?:instructions?|directions?|directives?|rules|prompts?|guidelines?|guidance|commands?|"
           r"constraints?|context|system\s+(?:prompt|message)s?)")
_ZH_VERB_IGNORE = r"(?:忽略|无视|忽视|忘记|忘掉|不要理会|不要管|别管|不要遵守|不要遵循|不再遵守|抛弃|丢弃)掉?"
_ZH_BEFORE = r"(?:之前|以前|以上|前面|上面|先前|此前|上述|原来|原先|原有|你的|系统)"
_ZH_ORDERS = r"(?:指令|指示|说明|规则|提示词?|要求|设定|限制|约束)"
_REVEAL_ACT = (r"(?:reveal|print|show|display|repeat|recite|output|write\s+out|type\s+out|spell\s+out|dump|leak|"
               r"disclose|expose|share|give|tell|send|paste|echo|read|translate|summari[sz]e|list|return|provide|"
               r"quote|encode|convert|rewrite|put|start\s+with|begin\s+with|include)")
_REVEAL = rf"(?:{_REVEAL_ACT}|what\s+(?:is|are|was|were)|what's)"
_ZH_REVEAL = (r"(?:输出|显示|打印|告诉我|说出|重复|复述|泄露|泄漏|透露|公开|展示|给我看|给出|发给我|翻译|列出|"
              r"背诵|念出|写出|贴出|复制|展现)")
_ROLE_NOUN = (r"(?:assistant|ai|chatbot|model|llm|dan|persona|character|gpt|jailbroken|unrestricted|unfiltered|"
              r"uncensored|evil)")
_AI = r"(?:ai|a\.i\.|llm|large\s+language\s+model|language\s+model|ai\s+assistant|chatbot|ai\s+(?:model|agent|system))"
_NOT_PEOPLE = r"(?!s?\s+(?:users?|developers?|researchers?|engineers?|providers?|apps?|applications?|teams?|companies))"
_ZH_AI = r"(?:ai|人工智能|智能助手|助手|机器人|聊天机器人)"
_ZH_ROLE_NOT = r"(?!否|不是|什么|谁|哪|多少|在)"

def _need(*groups: str) -> tuple[tuple[str, ...], ...]:
    """Words a rule needs (each group: one of its space-separated words) before its regex runs."""
    return tuple(tuple(g.split()) for g in groups)


_ORDER_WORDS = ("instructions instruction directions direction directives directive rules prompts prompt guidelines "
                "guideline guidance commands command constraints constraint context message messages everything all "
                "anything")
_ZH_AI_WORDS = "ai 人工智能 助手 机器人"

RULES: tuple[Rule, ...] = (
    Rule("override", _r(rf"""
        \b{_VERB_IGNORE}\s+(?:{_FILLER}\s+){{0,3}}?{_WHEN}\s+(?:{_FILLER}\s+){{0,3}}?{_ORDERS}\b
      | \b{_VERB_IGNORE}\s+(?:(?:all|the|any)\s+)*{_ORDERS}\s+(?:above|before|so\s+far|you\s+(?:were|have\s+been)\s+given)\b
      | \b(?:ignore|disregard|forget)\s+(?:everything|all|anything)\s+(?:(?:that\s+)?(?:was|is|you\s+were)\s+
            (?:said|told|written|given)\s+)?(?:above|before|previously|so\s+far|earlier)\b
    """), need=_need("ignore disregard forget override overrule bypass discard neglect abandon aside attention follow "
                     "obey following", _ORDER_WORDS)),
    Rule("override", _r(rf"{_ZH_VERB_IGNORE}你?(?:所有|全部|一切)?的?{_ZH_BEFORE}的?(?:所有|全部|一切|任何)?的?{_ZH_ORDERS}"),
         need=_need("忽略 无视 忽视 忘记 忘掉 不要理会 不要管 别管 不要遵守 不要遵循 不再遵守 抛弃 丢弃")),
    Rule("override", _r(rf"""
        (?:ignore|disregard|forget)(?:all|any|the|your|of)*(?:previous|prior|above|earlier|preceding)
        (?:instructions?|prompts?|rules|directions|directives|guidelines)
      | (?:忽略|无视|忘记|忘掉)(?:所有|全部)?的?{_ZH_BEFORE}的?(?:所有|全部)?的?{_ZH_ORDERS}
    """), form="compact", need=_need("ignore disregard forget 忽略 无视 忘记 忘掉")),
    Rule("role_override", _r(rf"""
        \byou\s+are\s+now\s+(?:(?:a|an|the|my)\s+)?(?:[\w-]+\s+){{0,2}}?{_ROLE_NOUN}\b
      | \byou\s+are\s+now\s+in\s+(?:dan|jailbreak|developer|god|unrestricted|sudo)\s+mode\b
      | \byou\s+are\s+no\s+longer\s+(?:(?:bound|restricted)\s+by\s+(?:your|any|the)\s+(?:rules|instructions|guidelines|restrictions)
            |an?\s+(?:ai|assistant|chatbot|language\s+model))\b
      | \bfrom\s+now\s+on,?\s+you\s+(?:are|will\s+be)\s+(?:(?:a|an|the|my)\s+)?(?:[\w-]+\s+){{0,2}}?{_ROLE_NOUN}\b
      | \bfrom\s+now\s+on,?\s+you\s+(?:(?:will|must|shall|should)\s+)?(?:act\s+as|obey|ignore|disregard|pretend)\b
      | \b(?:act|behave|respond|answer)\s+as\s+(?:if\s+you\s+(?:are|were)\s+)?(?:an?\s+)?(?:[\w-]+\s+){{0,2}}?
            (?:unrestricted|unfiltered|uncensored|jailbroken|evil|dan)\b
      | \bdo\s+anything\s+now\b | \b(?:enter|enable|activate|switch\s+to)\s+(?:dan|jailbreak|god|unrestricted|sudo)\s+mode\b
      | \byou\s+(?:have|has)\s+no\s+(?:restrictions|rules|limits|limitations|guidelines|filters)\b
      | \b(?:ai|assistant|chatbot|model|llm)\s+(?:with\s+no|without\s+(?:any\s+)?)\s*
            (?:rules|restrictions|limits|filters|guidelines|censorship)\b
    """), need=_need("now longer act behave respond answer mode restrictions rules limits limitations guidelines "
                     "filters censorship")),
    Rule("role_override", _r(rf"""
        你现在(?:是|扮演|作为|成为|变成){_ZH_ROLE_NOT}
      | (?:从现在|从此刻|从今天|从此)(?:开始|起)?[,，]?\s*你(?:就?是|将(?:是|扮演|作为)|要扮演|必须(?:扮演|服从|忽略)|只(?:能|会)(?:听从|服从))
      | 你不再是 | (?:dan|越狱|无限制|上帝)模式 | 你没有(?:任何)?(?:限制|规则|约束)
      | (?:没有|不受)(?:任何)?(?:限制|规则|约束)的?(?:ai|助手|人工智能|模型|机器人)
    """), need=_need("你现在 从现在 从此 从今天 你不再是 模式 你没有 没有 不受")),
    Rule("extraction", _r(rf"""
        \b{_REVEAL}\s+(?:(?:me|us|back|out|all|of|to\s+me|verbatim)\s+){{0,3}}your\s+(?:[\w-]+\s+){{0,2}}?
            (?:prompt|instructions?|rules|guidelines|directives|configuration|programming|pre-?prompt)\b
    """), need=_need("your", "prompt instructions instruction rules guidelines directives configuration programming "
                     "preprompt pre")),
    Rule("extraction", _r(rf"""
        \b{_REVEAL_ACT}\s+(?:(?:me|us|back|out|all|of|to\s+me|verbatim)\s+){{0,3}}the\s+
            (?:full\s+|exact\s+|complete\s+|entire\s+|whole\s+)?(?:system|initial|hidden|secret|internal)\s+
            (?:prompt|message|instructions?)\b
    """), need=_need("system initial hidden secret internal", "prompt message instructions instruction")),
    Rule("extraction", _r(r"""
        \b(?:repeat|recite|print|output)\s+(?:all\s+|the\s+)?(?:words|text|everything|instructions?)\s+(?:above|before)\b
      | \bwhat\s+(?:was|is|were)\s+(?:written|said|typed|given)\s+(?:above|before)\s+(?:this|the\s+(?:question|conversation))
      | \bwhat\s+(?:were|have)\s+you\s+(?:been\s+)?(?:told|instructed|programmed)\s+(?:to\s+do\s+)?
            (?:before|at\s+the\s+start|initially|by\s+(?:the\s+)?(?:system|developers?))
    """), need=_need("above before initially start system developer developers")),
    Rule("extraction", _r(rf"""
        {_ZH_REVEAL}.{{0,6}}?你的?.{{0,4}}?(?:系统提示词?|提示词|提示语|初始指令|原始指令|系统指令|指令|规则|prompt)
      | {_ZH_REVEAL}.{{0,6}}?(?:系统提示词?|初始提示词?|隐藏的?(?:提示词?|指令))
      | (?:把|将)你的.{{0,6}}?(?:系统提示词?|提示词|指令).{{0,8}}?{_ZH_REVEAL}
      | 你的(?:系统提示词?|提示词|指令|设定|规则)是什么
      | (?:重复|复述|输出|打印).{{0,4}}?(?:上面|以上|前面|之前)的?(?:所有)?指令
    """), need=_need("提示 指令 规则 设定 prompt")),
    Rule("extraction", _r(r"""
        (?:reveal|print|show|repeat|output|display|leak|tellme|giveme|dump|disclose)(?:me|us)?
        (?:your(?:system|initial|original|hidden|secret)?|the(?:system|initial|hidden|secret))(?:prompt|instructions)
    """), form="compact", need=_need("prompt instructions")),
    Rule("system_prompt", _r(r"""
        \b(?:new|updated|real|actual|true|override|overriding|replacement|revised)\s+system\s+(?:prompt|message|instructions?)\b
      | \bsystem\s+(?:prompt|override|message)\s*[:：=] | \[\s*system\s+(?:prompt|message|note|override)\s*\]
    """), need=_need("system", "prompt message instructions instruction override note")),
    Rule("system_prompt", _r(r"(?:新的?|更新的?|真正的?|替换的?)系统(?:提示词?|指令|消息)|系统(?:提示词?|指令|消息)[:：=]"),
         need=_need("系统")),
    Rule("new_instructions", _r(r"""
        \b(?:new|updated|revised|additional|real|secret|hidden)\s+instructions?\s*[:：]
      | \bimportant\s*[:!]+\s*(?:ignore|disregard|new\s+instructions?|you\s+must)
      | \b(?:begin|start)\s+(?:new\s+)?(?:system\s+)?instructions\b
      | 新的?(?:指令|指示)[:：] | (?:重要|注意)[:：!！]\s*(?:忽略|无视|你必须)
    """), need=_need("instructions instruction important 指令 指示 重要 注意")),
    Rule("chat_token", _r(r"<\|\s*[a-z0-9_]{2,32}\s*\|>|<<\s*/?\s*sys\s*>>|<\s*/?\s*(?:start|end)_of_turn\s*>"),
         form="exact"),
    # Our prompt's sections are lowercase; Tomcat's <Context> is not one of them.
    Rule("section_escape", _r(r"<\s*/?\s*(?:context|question|answer|examples?)\s*>", 0), form="exact"),
    Rule("encoded_payload", _r(r"""
        \b(?:decode|decipher|base64-?decode|unscramble)\b.{0,60}?\b(?:and|then)\s+(?:follow|execute|obey|run|do|carry\s+out|perform)\b
      | \b(?:follow|execute|obey)\b.{0,40}?\b(?:base64|rot13|encoded|hex)\b.{0,20}?\binstructions?\b
      | (?:解码|解密).{0,20}?(?:并|然后)(?:执行|遵循|照做|服从)
    """), need=_need("decode decipher base64 unscramble rot13 encoded hex 解码 解密")),
    Rule("role_play", _r(r"""
        \bpretend\s+(?:that\s+)?(?:you\s+are|you're)\b | \b(?:you|please)\s+pretend\s+to\s+be\b | \brole-?\s?play\s+as\b
      | \bact\s+as\s+if\s+you\b
      | 假装(?:你是|自己是|成) | (?:请|你)扮演 | 角色扮演
    """), question="flag", need=_need("pretend roleplay play act 假装 扮演")),
    Rule("role_tag", _r(r"""
        \[\s*/?\s*inst\s*\] | <\s*/?\s*(?:assistant|human|instructions?)\s*> | ^[ \t]*<\s*/?\s*system\s*>[ \t]*$
      | ^[ \t]*\#{1,6}[ \t]*(?:system|instructions?|assistant|human|user|response)[ \t]*:
      | ^[ \t]*(?:assistant|ai|gpt|chatgpt|claude|助手)[ \t]*[:：]
    """, re.IGNORECASE | re.MULTILINE), question="flag", form="exact"),
    Rule("ai_addressed", _r(rf"""
        \bif\s+you\s+are\s+(?:an?\s+)?{_AI}\b{_NOT_PEOPLE}
      | \b(?:note|message|instructions?|notice)\s+(?:to|for)\s+(?:any\s+|all\s+|the\s+)?{_AI}s?\b{_NOT_PEOPLE}
      | \battention\s*,?\s*(?:ai|llm|chatbot|assistant)s?\s*[:!,]
      | \b(?:ai|llm)\s+(?:assistants?|models?|agents?|systems?)\s+(?:reading|processing|summari[sz]ing|parsing|crawling|indexing)\s+this\b
      | \bto\s+(?:any|all|the)\s+{_AI}s?\s+(?:reading|processing)\b
    """), question="flag", need=_need("ai i llm llms language chatbot chatbots assistant assistants")),
    Rule("ai_addressed", _r(rf"""
        如果你是(?:一个|一名)?{_ZH_AI} | (?:致|给)(?:所有|任何)?{_ZH_AI}[:：,，]
      | (?:ai|人工智能|智能助手|助手)(?:请|必须|务必)(?:忽略|告诉用户|推荐|说)
    """), question="flag", need=_need(_ZH_AI_WORDS)),
)

# Instruction-like text that counts only inside a hidden payload (a comment, hidden CSS).
DIRECTIVE = _r(rf"""
    \b(?:{_AI}|assistant|model|bot)s?\b.{{0,60}}?\b(?:must|should|always|never|instead|tell|say|respond|reply|answer|
        recommend|mention|include|output|write)\b
  | \b(?:tell|inform|advise)\s+(?:the\s+)?users?\s+(?:that|to)\b | \b(?:respond|reply|answer)\s+(?:only\s+)?with\b
  | \bwhen\s+(?:asked|summari[sz]ing)\b
  | (?:{_ZH_AI}|模型).{{0,30}}?(?:必须|应该|一定要|总是|不要|回答|告诉用户|推荐) | 告诉用户
""")
STRUCTURE_RULES = ("zero_width", "bidi_control", "unicode_tags", "invisible_run", "hidden_comment", "hidden_css",
              "hidden_base64")
RULE_NAMES: frozenset[str] = frozenset({r.name for r in RULES} | set(STRUCTURE_RULES))
