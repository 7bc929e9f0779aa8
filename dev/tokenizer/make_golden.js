// Writes the golden GPT-2 token ids that data_prep/test_tokenize checks,
// using an independent GPT-2 tokenizer: npm tiktoken (pinned in package.json),
// its `gpt2` encoding, encode_ordinary.
//
//   cd dev/tokenizer && npm ci && node make_golden.js
//
// Outputs (paths relative to the repository root):
//   data_prep/golden/tricky.tsv     name <TAB> hex of the UTF-8 input <TAB> ids, comma separated
//   data_prep/golden/moby_dick.txt  token count and FNV-1a-64 of the ids of the whole
//                                   tiny corpus (needs `data_prep/fetch.sh tiny` first)
"use strict";
const fs = require("fs");
const path = require("path");
const { get_encoding } = require("tiktoken");

const root = path.resolve(__dirname, "..", "..");
const enc = get_encoding("gpt2");
const tiktokenVersion = JSON.parse(fs.readFileSync(path.join(__dirname, "node_modules", "tiktoken", "package.json"), "utf8")).version;

// the tricky strings: each exercises one part of the regex or the merges
const cases = [
  ["contractions", "I'm sure you'll see they've said it's what we'd do, isn't it? I'd've"],
  ["contractions_upper", "DON'T WE'RE YOU'LL it'S 'S"],
  ["contractions_alone", "'s't're've'm'll'd''' 'x"],
  ["quote_words", "rock 'n' roll, 'quoted' and ‘curly’ ’s"],
  ["spaces_run", "a     b  c\td        e"],
  ["spaces_edges", "   leading and trailing   "],
  ["spaces_only", "          "],
  ["spaces_newlines", "line one   \n   \n\n    indented\n\t\tdeep\n"],
  ["tabs", "\tkey:\tvalue\t\t\tend\t"],
  ["crlf", "first line\r\nsecond line\r\n\r\nfourth\r\n"],
  ["cr_only", "old mac\rline\r\r"],
  ["digits", "0 1 12 123 1234 12345 123456 3.14159 1,000,000 2024-05-20 0x7f 1e-9"],
  ["digit_letters", "abc123def 4th 21st 1990s"],
  ["accents", "café naïve résumé Ångström über façade jalapeño Dvořák"],
  ["combining", "cafe\u0301 n\u0303 a\u0308\u0301"],
  ["cjk", "你好，世界！这是一个测试。日本語のテキストです。한국어 텍스트입니다."],
  ["emoji", "I ❤️ tokens 😀😃😄 👍🏽 🇫🇷🇯🇵 👨‍👩‍👧‍👦 done"],
  ["rtl_hebrew", "שלום עולם, זה מבחן."],
  ["rtl_arabic", "مرحبا بالعالم! هذا اختبار ١٢٣."],
  ["mixed_scripts", "Привет мир, Γειά σου Κόσμε, नमस्ते दुनिया"],
  ["unicode_spaces", "a\u00a0b\u2003c\u3000d\u2009e\u202ff\u205fg"],
  ["unicode_line_breaks", "a\u0085b\u2028c\u2029d\u000bx\u000cy"],
  ["unicode_numbers", "① ½ ² Ⅻ ٣ １２３ ௰"],
  ["symbols", "!!! ??? ... --- === +++ *** /// \\\\ @#$%^&*() {}[]<>|~`"],
  ["code", "int main(int argc, char **argv) {\n    for (int i = 0; i < argc; i++) {\n        printf(\"%s\\n\", argv[i]);\n    }\n    return 0;\n}\n"],
  ["python", "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n"],
  ["url_email", "https://example.com/path?q=a&b=c#frag user.name+tag@example.org"],
  ["endoftext_literal", "before <|endoftext|> after"],
  ["control_chars", "a\u0000b\u0001c\u001fd\u007fe"],
  ["bom_zwj", "\ufeffstart\u200bzero\u200dwidth"],
  ["long_letters", "a".repeat(300)],
  ["long_equals", "=".repeat(257)],
  ["long_spaces", " ".repeat(200) + "x"],
  ["long_newlines", "\n".repeat(100)],
  ["long_word", "pneumonoultramicroscopicsilicovolcanoconiosis Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch"],
  ["long_hex", "0123456789abcdef".repeat(20)],
  ["long_mixed_run", "-=+*".repeat(40) + "\u00e9".repeat(60)],
  ["astral", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 𐍈 𓀀"],
];

// the opening of Moby Dick (public domain), its first 60 lines, is a case too
const mobyPath = path.join(root, "data", "raw", "moby_dick", "moby_dick.txt");
const moby = fs.existsSync(mobyPath) ? fs.readFileSync(mobyPath) : null;
if (moby) {
  const lines = moby.toString("utf8").split("\n").slice(0, 60).join("\n") + "\n";
  cases.push(["moby_dick_opening", lines]);
} else {
  console.error(`warning: ${mobyPath} missing (run data_prep/fetch.sh tiny); Moby Dick goldens not written`);
}

let out = "# golden GPT-2 ids from npm tiktoken " + tiktokenVersion +
  " (gpt2, encode_ordinary); made by dev/tokenizer/make_golden.js\n";
for (const [name, text] of cases) {
  const ids = Array.from(enc.encode_ordinary(text));
  out += name + "\t" + Buffer.from(text, "utf8").toString("hex") + "\t" + ids.join(",") + "\n";
}
fs.mkdirSync(path.join(root, "data_prep", "golden"), { recursive: true });
fs.writeFileSync(path.join(root, "data_prep", "golden", "tricky.tsv"), out);
console.error(`wrote ${cases.length} cases to data_prep/golden/tricky.tsv`);

// FNV-1a 64 over the ids written as uint32 little-endian
function fnv1a64(ids) {
  let h = 0xcbf29ce484222325n;
  const prime = 0x100000001b3n, mask = 0xffffffffffffffffn;
  for (const id of ids) {
    for (let k = 0; k < 4; k++) {
      h ^= BigInt((id >>> (8 * k)) & 0xff);
      h = (h * prime) & mask;
    }
  }
  return h.toString(16).padStart(16, "0");
}

if (moby) {
  const ids = enc.encode_ordinary(moby.toString("utf8"));
  const txt = "# tiktoken " + tiktokenVersion +
    " gpt2 encode_ordinary of data/raw/moby_dick/moby_dick.txt as one text; made by dev/tokenizer/make_golden.js\n" +
    `bytes ${moby.length}\ntokens ${ids.length}\nfnv1a64 ${fnv1a64(ids)}\n`;
  fs.writeFileSync(path.join(root, "data_prep", "golden", "moby_dick.txt"), txt);
  console.error(`wrote data_prep/golden/moby_dick.txt (${ids.length} tokens)`);
}
enc.free();
