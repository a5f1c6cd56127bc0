// Builds the package into dist/: the ESM build (dist/esm) and the CommonJS build (dist/cjs), each with
// its type declarations, from src/. First it writes src/generated/protos.ts, the repository's proto files
// (proto/, the server's own) as protobuf.js JSON, which the client hands to @grpc/proto-loader at run
// time: no .proto file is read from disk, so the two builds (and bundlers) need no path to find them.
//
//   node scripts/build.mjs            (npm run build; npm pack runs it too)
import { execFileSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import protobuf from 'protobufjs';

const here = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const protoDir = path.resolve(here, '../../proto');
// What the client calls: its native API and Envoy's. Their imports (Envoy's messages; the well-known
// google.protobuf types, which protobuf.js carries itself) come along.
const PROTOS = ['tollgate/v1/ratelimiter.proto', 'envoy/service/ratelimit/v3/rls.proto'];

function generateProtos() {
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) => (path.isAbsolute(target) ? target : path.join(protoDir, target));
  root.loadSync(PROTOS);
  const json = JSON.stringify(root.toJSON());
  const out = path.join(here, 'src/generated');
  mkdirSync(out, { recursive: true });
  writeFileSync(
    path.join(out, 'protos.ts'),
    `// Written by scripts/build.mjs from ${PROTOS.map((p) => `proto/${p}`).join(' and ')}: do not edit.\n` +
      `/** The services and messages the client uses, as protobuf.js JSON. */\n` +
      `export const PROTOS_JSON: string = ${JSON.stringify(json)};\n`,
  );
}

function tsc(project, ...flags) {
  execFileSync(process.execPath, [path.join(here, 'node_modules/typescript/bin/tsc'), '-p', project, ...flags], {
    cwd: here,
    stdio: 'inherit',
  });
}

generateProtos();
rmSync(path.join(here, 'dist'), { recursive: true, force: true });
tsc('tsconfig.json');
// Type-checked by the ESM build just now: the same sources, so this one only emits.
tsc('tsconfig.cjs.json', '--noCheck');
// The package is "type": "module"; this marks dist/cjs's .js (and .d.ts) files as CommonJS.
writeFileSync(path.join(here, 'dist/cjs/package.json'), '{ "type": "commonjs" }\n');
