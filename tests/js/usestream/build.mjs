// Bundles the useStream page (app.jsx, with React and the LangGraph SDK from tests/js's pinned
// packages) into OUTDIR: app.js beside a copy of index.html. Usage: node build.mjs OUTDIR
import { copyFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const [outdir] = process.argv.slice(2);
if (!outdir) throw new Error("usage: node build.mjs OUTDIR");

await build({
  entryPoints: [join(here, "app.jsx")],
  outfile: join(outdir, "app.js"),
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  jsx: "automatic",
  define: { "process.env.NODE_ENV": '"production"' },
  logLevel: "warning",
});
await copyFile(join(here, "index.html"), join(outdir, "index.html"));
