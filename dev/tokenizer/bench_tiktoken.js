// npm tiktoken's side of the tokenizer benchmark (see data_prep/bench_tokenize.c,
// which this mirrors): MB/s of gpt2 encode_ordinary on one core (the whole
// text as one string) and on all cores (the text cut just after every "\n\n",
// chunks shared out to one worker thread per core). Each figure is from the
// fastest repetition within SECONDS (default 2), after one warm-up.
//
//   node dev/tokenizer/bench_tiktoken.js TEXT [SECONDS]
//
// Prints one line:
//   tiktoken version=.. single_mbs=.. all_mbs=.. threads=.. bytes=.. tokens=.. chunk_tokens=..
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { Worker, isMainThread, parentPort, workerData } = require("worker_threads");
const { get_encoding } = require("tiktoken");

// chunk byte ranges: starts at 0 and just after every "\n\n", as the C side cuts them
function chunkStarts(buf) {
  const starts = [0];
  for (let i = 0; i + 1 < buf.length; i++) {
    if (buf[i] === 10 && buf[i + 1] === 10) { starts.push(i + 2); i++; }
  }
  if (starts[starts.length - 1] !== buf.length) starts.push(buf.length);
  return starts;
}

if (!isMainThread) {
  // worker: encode the chunks whose index it takes from the shared counter
  const enc = get_encoding("gpt2");
  const { chunks, counter } = workerData;
  const next = new Int32Array(counter);
  parentPort.on("message", () => {
    let tokens = 0;
    for (;;) {
      const c = Atomics.add(next, 0, 4);
      if (c >= chunks.length) break;
      for (let k = c; k < Math.min(c + 4, chunks.length); k++) tokens += enc.encode_ordinary(chunks[k]).length;
    }
    parentPort.postMessage(tokens);
  });
  parentPort.postMessage("ready");
} else {
  main();
}

async function main() {
  const file = process.argv[2];
  const seconds = Number(process.argv[3] || 2);
  const buf = fs.readFileSync(file);
  const text = buf.toString("utf8");
  const version = JSON.parse(fs.readFileSync(path.join(__dirname, "node_modules", "tiktoken", "package.json"), "utf8")).version;
  const enc = get_encoding("gpt2");

  // one core
  const tokens = enc.encode_ordinary(text).length; // warm-up
  const now = () => Number(process.hrtime.bigint()) / 1e9;
  let start = now(), best = Infinity;
  do {
    const t0 = now();
    enc.encode_ordinary(text);
    best = Math.min(best, now() - t0);
  } while (now() - start < seconds);
  const single = buf.length / best / 1e6;

  // all cores
  const starts = chunkStarts(buf);
  const chunks = [];
  for (let c = 0; c + 1 < starts.length; c++) chunks.push(buf.subarray(starts[c], starts[c + 1]).toString("utf8"));
  const nthreads = os.cpus().length;
  const counter = new SharedArrayBuffer(4);
  const workers = [];
  for (let i = 0; i < nthreads; i++) {
    const w = new Worker(__filename, { workerData: { chunks, counter } });
    await new Promise((resolve) => w.once("message", resolve));
    workers.push(w);
  }
  // one round: reset the counter, start every worker, wait for all; returns tokens
  async function round() {
    Atomics.store(new Int32Array(counter), 0, 0);
    const done = workers.map((w) => new Promise((resolve) => w.once("message", resolve)));
    workers.forEach((w) => w.postMessage("go"));
    return (await Promise.all(done)).reduce((a, b) => a + b, 0);
  }
  const chunkTokens = await round(); // warm-up
  start = now(); best = Infinity;
  do {
    const t0 = now();
    await round();
    best = Math.min(best, now() - t0);
  } while (now() - start < seconds);
  const all = buf.length / best / 1e6;
  workers.forEach((w) => w.terminate());
  enc.free();
  console.log(`tiktoken version=${version} single_mbs=${single.toFixed(2)} all_mbs=${all.toFixed(2)} threads=${nthreads} ` +
    `bytes=${buf.length} tokens=${tokens} chunk_tokens=${chunkTokens} chunks=${chunks.length}`);
}
