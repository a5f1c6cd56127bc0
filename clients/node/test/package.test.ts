/**
 * The tarball `npm pack` made, installed from it into a fresh directory by run-tests.sh
 * ($TOLLGATE_NODE_PACKED): imported as ESM and required as CommonJS by programs of that directory, each
 * making checks against a real Tollgate. (Its types are checked for both kinds of TypeScript consumer by
 * the tests' own compilation: support/consumer.cts and the ESM tests.)
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';

import { serve } from './support/fixtures.js';
import { newKey } from './support/processes.js';

const packed = process.env['TOLLGATE_NODE_PACKED'];

/** Three checks of one phone, as a program of the fresh directory, ESM or CommonJS, writes them. */
function consumer(load: string): string {
  return `${load}
const client = new Client({ target: process.argv[2], domain: 'test', deadlineMs: 10000, failure: 'closed' });
const phone = [{ phone: process.argv[3] }];
(async () => {
  const answers = [];
  for (let i = 0; i < 3; i++) {
    const decision = await client.check(phone);
    answers.push({ allowed: decision.allowed, remaining: decision.remaining, middleware: typeof expressRateLimit });
  }
  console.log(JSON.stringify(answers));
  client.close();
})();
`;
}

describe('the packed tarball, installed in a fresh directory', { skip: packed === undefined && 'run-tests.sh packs it (TOLLGATE_NODE_PACKED)' }, () => {
  const tollgate = serve();

  for (const [kind, file, load] of [
    ['ESM', 'consumer.mjs', "import { Client, expressRateLimit } from '@tollgate/client';"],
    ['CommonJS', 'consumer.cjs', "const { Client, expressRateLimit } = require('@tollgate/client');"],
  ] as const) {
    it(`runs as ${kind} and checks against a real Tollgate`, () => {
      writeFileSync(path.join(packed!, file), consumer(load));

      const output = execFileSync(process.execPath, [file, tollgate.server.grpc, newKey()], { cwd: packed!, encoding: 'utf8' });
      const answers: unknown = JSON.parse(output);

      assert.deepEqual(answers, [
        { allowed: true, remaining: 1, middleware: 'function' },
        { allowed: true, remaining: 0, middleware: 'function' },
        { allowed: false, remaining: 0, middleware: 'function' },
      ]);
    });
  }
});
