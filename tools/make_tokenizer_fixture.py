#!/usr/bin/env python3
"""Regenerates tests/fixtures/tokenizer/: the ids the official Hugging Face slow `Qwen2Tokenizer`
(transformers 4.57.3, the class the qwen-tts package loads) gives for a varied corpus, read from the
real tokenizer files in tests/fixtures/tokenizer/released/.

Writes three files:
- corpus.json:  [{"text": ..., "ids": [...]}, ...]  encode(text), no BOS/EOS (add_bos_token is false).
- decode.json:  [{"ids": [...], "text": ...}, ...]   decode(ids), including ids that cut UTF-8 sequences.
- classes.json: {"unicode": ..., "L": [[lo, hi], ...], "N": [...], "S": [...]}: the code points that
                the `regex` module (used by the pre-tokenizer regex) puts in \\p{L}, \\p{N} and \\s.

Usage: . /root/venv-oracle/bin/activate && python tools/make_tokenizer_fixture.py [TOKENIZER_DIR]
The outputs are deterministic.
"""

import json
import os
import random
import sys
import unicodedata

import regex
import transformers
from transformers import Qwen2Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fixtures", "tokenizer", "released")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")

# The two checks of MODEL-NOTES.md §2.7, verbatim.
NOTES_CHECKS = [
    (
        "<|im_start|>assistant\nHello world, this is Qwen3-TTS.<|im_end|>\n<|im_start|>assistant\n",
        [151644, 77091, 198, 9707, 1879, 11, 419, 374, 1207, 16948, 18, 9285, 9951, 13, 151645, 198, 151644, 77091, 198],
    ),
    ("<|im_start|>user\nSpeak happily.<|im_end|>\n", [151644, 872, 198, 95845, 36775, 13, 151645, 198]),
]

CORPUS = [
    # Empty and trivial.
    "",
    " ",
    "a",
    "A",
    "0",
    ".",
    "\n",
    # English.
    "Hello world",
    " Hello world",
    "Hello world, this is Qwen3-TTS.",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!",
    "She sells sea shells by the sea shore; the shells she sells are surely seashells.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness...",
    "To be, or not to be: that is the question.",
    "Dr. Smith arrived at 10:30 a.m. on Jan. 5th, 2024 -- early, as usual.",
    "e-mail: john.doe+test@example.com, web: https://www.example.org/path?q=1&r=two#frag",
    "C:\\Program Files\\qtts\\bin\\qtts.exe --model ./models/qwen3-tts.gguf",
    "fn main() { println!(\"Hello, {}!\", name); }",
    "snake_case_identifier and camelCaseIdentifier and SCREAMING_CASE",
    "iPhone, eBay, McDonald's, O'Neill, rock'n'roll, y'all, ma'am",
    "Mr. and Mrs. Dursley, of number four, Privet Drive, were proud to say that they were perfectly normal.",
    "\"Quoted text\" and 'single quoted' and `backticks` and «guillemets» and „German quotes“.",
    "The price is $1,234.56 (about €1.150,00 or £999.99) — plus 7.5% tax.",
    "Call +1 (555) 123-4567 or 555.123.4567 ext. 89",
    # Contractions in various cases.
    "don't won't can't shouldn't isn't",
    "DON'T WON'T CAN'T",
    "it's IT'S It'S iT's",
    "we'll WE'LL We'Ll wE'lL",
    "they're THEY'RE They'Re",
    "we've WE'VE We'vE",
    "I'm I'M i'm",
    "he'd HE'D He'D",
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "'sup 'tis 'twas 'round 'em",
    "''s '''ll 's's",
    "'x 'z 'ss 'lll 'ree",
    "John's book, the boys' books, the children's toys",
    "its' it’s it‘s (typographic apostrophes are not contractions)",
    "'ſ and 'ſt (long s folds to s)",
    "x'S y'Ll z'rE",
    "' s ' ll",
    "'",
    "''",
    "'s",
    "'LL",
    "Rock 'n' roll isn't dead, it's just sleepin'.",
    "\n's\n'll",
    # Digits and long numbers.
    "0123456789",
    "3.14159265358979323846264338327950288419716939937510",
    "1,000,000 and 1.000.000 and 1 000 000 and 1_000_000",
    "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
    "Version 2.0.1-beta.3+build.456",
    "2024-01-15T10:30:00Z",
    "0x1F600 0b1010 0o777 1e-10 6.022e23",
    "Room 101, floor -2, temperature -40°C = -40°F",
    "١٢٣٤٥٦٧٨٩٠ ۱۲۳ १२३४ ๑๒๓ 一二三 ①②③ ½ ¾ ² ³ Ⅻ ⅷ",
    "abc123def456",
    "123abc",
    "x²+y²=z²",
    # Punctuation runs.
    "!!!",
    "?!?!?!",
    "...",
    "…",
    "Wait... what?!",
    "-----",
    "=====================================",
    "***bold*** ___under___ ~~~strike~~~",
    "(((nested))) [[[brackets]]] {{{braces}}}",
    "<<<>>> <|> |<| <|im_end> <im_end|> <|im_end|",
    "#!/usr/bin/env bash\n# comment\nset -euo pipefail\n",
    "a.b,c;d:e!f?g",
    " !",
    "  !",
    "\t!",
    "!\n",
    "!\r\n\r\n",
    "!!\n\n\nabc",
    "¿Qué? ¡Hola!",
    "§1 ¶2 † ‡ • ‣ ※",
    "©®™ ℃ ℉ № ℗",
    "→←↑↓ ⇒ ⇔ ∀∃∈∉ ∑∏∫ √∞ ≈≠≤≥",
    "\"\"\"docstring\"\"\"",
    # Whitespace: leading, trailing, multiple, tabs, newlines.
    "  leading spaces",
    "trailing spaces  ",
    "multiple   spaces   between   words",
    "   ",
    "          ",
    "\t",
    "\t\t\t",
    "\ttab\tseparated\tvalues\t",
    "col1\tcol2\tcol3\n1\t2\t3\n",
    "line1\nline2\nline3",
    "line1\n\nline2\n\n\nline3",
    "line1\r\nline2\r\nline3\r\n",
    "\r\n",
    "\r\n\r\n",
    "\n\n\n\n",
    "\r",
    "\r\r\n\n\r",
    "  \n  ",
    "  \n  word",
    "word  \n  word",
    " \n \n x",
    "\n \n \n",
    "a \t b",
    "a\t \tb",
    " \t\n\t x",
    "end with newline\n",
    "end with spaces and newline  \n",
    "\u00a0non-breaking\u00a0space",
    "ideographic\u3000space\u3000\u3000end",
    "em\u2003space en\u2002space thin\u2009space",
    "line\u2028separator paragraph\u2029separator",
    "vertical\u000btab form\u000cfeed next\u0085line",
    "info\u001fseparator\u001erecord\u001dgroup\u001cfile",
    "zero\u200bwidth\u200cnon\u200djoiner",
    "\ufeffBOM at start",
    "soft\u00adhyphen",
    "  \t  \n\n  \t  ",
    "a\n",
    "\na",
    "\n\na",
    " a",
    "  a",
    "   a",
    # German.
    "Grüße aus München! Die Straße ist schön.",
    "Donaudampfschifffahrtselektrizitätenhauptbetriebswerkbauunterbeamtengesellschaft",
    "Ärger, Öl, Übermut; ärger, öl, übermut; ẞ ß",
    "Rindfleischetikettierungsüberwachungsaufgabenübertragungsgesetz",
    "Sehr geehrte Damen und Herren, vielen Dank für Ihre Nachricht vom 3. März.",
    # French.
    "Ça va? Très bien, merci! L'été est arrivé à Noël.",
    "Je m'appelle Jean-François et j'habite à Paris depuis l'année dernière.",
    "Œuvre, cœur, sœur, naïve, Noël, où, hôtel, forêt.",
    "Qu'est-ce que c'est ? « Bonjour » dit-il.",
    # Spanish.
    "¿Dónde está la biblioteca? Mañana iré al año nuevo.",
    "El niño comió piña y jalapeños en la montaña.",
    # Italian.
    "Perché l'università è così lontana? Andrò là domani.",
    "Buongiorno, come stai? Tutto bene, grazie.",
    # Portuguese.
    "Ação, coração, não, pão, avô, avó, você.",
    "Olá! Tudo bem? Obrigado pela atenção.",
    # Russian.
    "Привет, мир! Как дела?",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ёлка, ёжик, объём — ЁЛКА.",
    "Достопримечательности Санкт-Петербурга",
    # Other Cyrillic, Greek.
    "Γειά σου κόσμε! Ελληνικά: αβγδεζηθ ΑΒΓΔ",
    "Ѕ Ї Ґ Ў Ђ Ћ Љ Њ",
    # Chinese.
    "你好，世界！",
    "今天天气很好，我们去公园散步吧。",
    "中华人民共和国成立于一九四九年十月一日。",
    "我爱北京天安门，天安门上太阳升。",
    "机器学习是人工智能的一个分支。",
    "你好world",
    "Qwen3-TTS是一个文本转语音模型。",
    "繁體中文：這是一個測試。",
    "“引号”和‘单引号’以及《书名号》【方括号】",
    "价格：￥100元，约合$14。",
    "第1章 第２章 第三章",
    # Japanese.
    "こんにちは世界",
    "今日はいい天気ですね。",
    "カタカナとひらがなと漢字。",
    "東京スカイツリーは634メートルです。",
    "ｶﾀｶﾅ 半角カナ",
    "私の名前は田中です。よろしくお願いします！",
    # Korean.
    "안녕하세요, 세계!",
    "한국어 텍스트 음성 변환 테스트입니다.",
    "대한민국의 수도는 서울입니다.",
    # Arabic.
    "مرحبا بالعالم",
    "اللغة العربية جميلة جداً.",
    "السَّلَامُ عَلَيْكُمْ",
    "العدد ١٢٣ والعدد 456",
    # Hebrew.
    "שלום עולם",
    # Hindi and other Indic.
    "नमस्ते दुनिया",
    "हिन्दी भाषा भारत की राजभाषा है।",
    "क्षत्रिय ज्ञान श्री",
    "বাংলা ভাষা",
    "தமிழ் மொழி",
    "తెలుగు",
    # Thai, Vietnamese, others.
    "สวัสดีครับ ภาษาไทย",
    "Tiếng Việt có dấu: Xin chào, cảm ơn bạn nhiều lắm.",
    "Türkçe: İstanbul, ığdır, şişli, çöp",
    "Polski: Zażółć gęślą jaźń",
    "Čeština: Příliš žluťoučký kůň úpěl ďábelské ódy",
    "Ελληνικά και English και русский",
    "ქართული ენა",
    "Հայերեն",
    "አማርኛ",
    "ᠮᠣᠩᠭᠣᠯ",
    "ᏣᎳᎩ",
    # Emoji, including ZWJ sequences, skin tones, flags, keycaps.
    "😀",
    "😀😃😄😁",
    "I ❤️ Rust 🦀!",
    "👨‍👩‍👧‍👦 family",
    "👩🏽‍💻 coder",
    "🏳️‍🌈 🏴‍☠️",
    "🇺🇸🇨🇳🇯🇵🇰🇷🇩🇪🇫🇷",
    "🇺🇸 USA 🇬🇧 UK",
    "1️⃣ 2️⃣ #️⃣ *️⃣",
    "👍🏻👍🏼👍🏽👍🏾👍🏿",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland",
    "hello😀world",
    "😀hello",
    "hello 😀",
    " 😀",
    "  😀",
    "😀\n",
    "☺ ☹ ☀ ★ ☆ ♠ ♥ ♦ ♣",
    "🎉🎊🎈 Happy New Year! 🎆🎇✨",
    "🙂‍↔️ 🐦‍🔥 🍋‍🟩",
    # Mixed scripts.
    "Hello你好こんにちは안녕Привет",
    "AI人工智能ML机器学习",
    "Tokyo東京Seoul서울Moscowмосква",
    "abcабвαβγ",
    "iPhone15发布了！价格是5999元。",
    "The word 'café' in Japanese is カフェ and in Chinese is 咖啡.",
    "مرحبا Hello שלום",
    # Combining marks and non-NFC input.
    "cafe\u0301",
    "e\u0301te\u0301",
    "Cafe\u0301 Ame\u0301lie",
    "n\u0303",
    "A\u030a",
    "\u212b",
    "\u2126",
    "o\u0308\u0304",
    "a\u0301\u0302\u0303",
    "\u0301",
    "\u0301a",
    " \u0301",
    "x\u0332y\u0332z\u0332",
    "\u1100\u1161\u11a8",
    "\u1112\u1161\u11ab\u1100\u1173\u11af",
    "\u304b\u3099",
    "\u30cf\u309a",
    "\uff76\uff9e",
    "\u0915\u093c",
    "\u0627\u0653",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "\ufb01 \ufb02 \ufb00",
    "\u00bd \u2153",
    "\u1e9b\u0323",
    "\u0041\u030a\u0301",
    "\u0063\u0327\u0301",
    # Special and added tokens embedded in text.
    "<|im_start|>assistant\nHello<|im_end|>\n",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|><|im_end|>",
    "<|im_start|><|im_start|><|im_start|>",
    "text<|im_end|>text",
    "text <|im_end|> text",
    "  <|im_end|>  ",
    "\n<|im_end|>\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<tts_pad><tts_text_bos><tts_text_eod>",
    "<tts_text_bos_single> and <tts_text_bos> and <tts_text_bos_",
    "<tts_text_bos_singl",
    "<|audio_start|><|audio_pad|><|audio_end|>",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "<think>reasoning</think>answer",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|fim_prefix|>def f():<|fim_suffix|>    return 1<|fim_middle|>",
    "<|object_ref_start|>a<|object_ref_end|><|box_start|>(1,2)<|box_end|>",
    "<<|im_start|>>",
    "<|im_start|im_end|>",
    "<|IM_START|>",
    "< |im_start| >",
    "<|im_start|>'s",
    "<|im_start|> hello",
    "hello<|im_end|>'ll",
    "😀<|im_end|>😀",
    "你好<|im_end|>世界",
    "cafe\u0301<|im_end|>e\u0301",
    "<|im_start|>assistant\n你好，今天天气怎么样？<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nSpeak slowly and calmly, with a warm tone.<|im_end|>\n",
    "<|im_start|>assistant\nThe reference transcript.<|im_end|>\n",
    # Hostile but valid text.
    "\u0000",
    "a\u0000b",
    "\u0000\u0000\u0000",
    "\ufffd",
    "\ufffd\ufffd replacement",
    "\u0001\u0002\u0003\u001b[31mred\u001b[0m",
    "\u007f\u0080\u0081\u009f",
    "\ue000\uf8ff private use",
    "\uffff\ufffe nonchars",
    "\U0010ffff\U000f0000",
    "\U0001d400\U0001d401\U0001d402 math bold",
    "\U00020000\U0002a6d6 CJK ext B",
    "\U00010348\U00010330 Gothic",
    "\u202eright-to-left override\u202c",
    "\u200e\u200f marks",
    "a\ufe0f b\ufe0e",
    "\U000e0001\U000e0041 tags",
    "\u0300\u0300\u0300",
    "\u00ad",
    "\u034f",
    # Very long words.
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "Supercalifragilisticexpialidocious" * 10,
    "a" * 1000,
    "ab" * 500,
    "abc" * 300,
    "!" * 300,
    "0" * 200,
    " " * 500,
    "\n" * 200,
    "\t" * 100,
    "😀" * 100,
    "你" * 300,
    "thequickbrownfoxjumpsoverthelazydog" * 20,
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.",
    "中华人民共和国是工人阶级领导的以工农联盟为基础的人民民主专政的社会主义国家社会主义制度是中华人民共和国的根本制度中国共产党领导是中国特色社会主义最本质的特征禁止任何组织或者个人破坏社会主义制度",
    "ﾃｽﾄ" * 50,
    "ЁжикВТумане" * 30,
    "https://example.com/" + "very-long-path-segment/" * 20,
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    "abababababababababababababababababababababababababababababababababababababababababab",
    "TTS" * 100,
    "ñ" * 200,
    "é" * 100 + "e\u0301" * 100,
]

# Systematic small combinations: every pair of interesting characters, around letters.
PIECES = ["a", "Z", " ", "  ", "\t", "\n", "\r\n", "'", "'s", "'LL", "1", "23", "!", "?!", ".", "😀", "你", "é", "e\u0301", "\u3000", "\u00a0", "<|im_end|>"]


def combos():
    rng = random.Random(20250101)
    out = []
    for a in PIECES:
        for b in PIECES:
            out.append(a + b)
    for _ in range(120):
        n = rng.randint(3, 12)
        out.append("".join(rng.choice(PIECES + ["hello", "World", "ß", "Ж", "日本", "١"]) for _ in range(n)))
    return out


def ranges(pred):
    out = []
    start = None
    for c in range(0x110000 + 1):
        inside = c <= 0x10FFFF and not (0xD800 <= c <= 0xDFFF) and pred(chr(c))
        if inside and start is None:
            start = c
        elif not inside and start is not None:
            out.append([start, c - 1])
            start = None
    return out


def main():
    print(f"transformers {transformers.__version__}, regex {regex.__version__}, unicodedata {unicodedata.unidata_version}")
    tok = Qwen2Tokenizer.from_pretrained(TOK_DIR)
    assert type(tok).__name__ == "Qwen2Tokenizer", type(tok)

    for text, ids in NOTES_CHECKS:
        got = tok.encode(text)
        assert got == ids, f"MODEL-NOTES §2.7 check failed for {text!r}: {got}"

    texts = []
    seen = set()
    for t in [t for t, _ in NOTES_CHECKS] + CORPUS + combos():
        if t not in seen:
            seen.add(t)
            texts.append(t)
    corpus = [{"text": t, "ids": tok.encode(t)} for t in texts]

    # Decode cases: whole encodings, and slices of them that cut multi-byte characters.
    rng = random.Random(7)
    decode_ids = [[], [151644], [151643, 151645], [9707, 151645, 1879], [151671, 151672, 151673, 151674]]
    for entry in corpus:
        ids = entry["ids"]
        if len(ids) >= 2 and rng.random() < 0.3:
            a = rng.randrange(0, len(ids))
            b = rng.randrange(a + 1, len(ids) + 1)
            decode_ids.append(ids[a:b][:64])
    for _ in range(40):
        decode_ids.append([rng.randrange(0, 151643) for _ in range(rng.randint(1, 8))])
    # Single-byte tokens of bytes >= 0x80 (ids 94..105, 106..187 and 188..255 hold them, with the
    # control bytes): random mixes exercise the U+FFFD replacement of invalid UTF-8.
    for _ in range(150):
        n = rng.randint(1, 12)
        decode_ids.append([rng.choice([rng.randrange(94, 256)] * 6 + [rng.randrange(151643, 151676), rng.randrange(0, 94)]) for _ in range(n)])
    decode = [{"ids": ids, "text": tok.decode(ids)} for ids in decode_ids]

    classes = {
        "unicode": f"regex {regex.__version__}",
        "L": ranges(lambda s: regex.match(r"\p{L}", s) is not None),
        "N": ranges(lambda s: regex.match(r"\p{N}", s) is not None),
        "S": ranges(lambda s: regex.match(r"\s", s) is not None),
    }

    os.makedirs(OUT, exist_ok=True)
    for name, value in [("corpus.json", corpus), ("decode.json", decode), ("classes.json", classes)]:
        path = os.path.join(OUT, name)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(value, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        print(f"{path}: {os.path.getsize(path)} bytes")
    print(f"{len(corpus)} corpus strings, {len(decode)} decode cases")

    # For information only: does the fast tokenizer (converted from the same files) agree?
    try:
        from transformers import Qwen2TokenizerFast

        fast = Qwen2TokenizerFast.from_pretrained(TOK_DIR)
        bad = [e["text"] for e in corpus if fast.encode(e["text"]) != e["ids"]]
        print(f"fast tokenizer disagrees on {len(bad)} strings" + (f", e.g. {bad[:5]!r}" if bad else ""))
    except Exception as e:  # noqa: BLE001
        print(f"fast tokenizer not compared: {e}")


if __name__ == "__main__":
    main()
