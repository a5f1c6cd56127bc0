/** Certificates made for a test run with the openssl command line: CAs, and leaves they sign. */
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import { tempDir } from './processes.js';

/** A certificate and its key, as PEM files. */
export interface Pem {
  readonly cert: string;
  readonly key: string;
  /** The certificate's contents. */
  readonly certPem: Buffer;
  /** The key's contents. */
  readonly keyPem: Buffer;
}

const dir = tempDir('certs');

function openssl(...args: string[]): void {
  execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
}

function pem(name: string): Pem {
  const cert = path.join(dir, `${name}.crt`);
  const key = path.join(dir, `${name}.key`);
  return { cert, key, certPem: readFileSync(cert), keyPem: readFileSync(key) };
}

const EC = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];

/** A self-signed CA. */
export function ca(name: string): Pem {
  openssl('req', '-x509', ...EC, '-days', '2', '-subj', `/CN=${name}`, '-keyout', `${name}.key`, '-out', `${name}.crt`,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign');
  return pem(name);
}

/** A leaf signed by `issuer`, for `usage` (serverAuth or clientAuth), naming `names` (DNS:… or IP:…). */
export function leaf(issuer: Pem, name: string, usage: 'serverAuth' | 'clientAuth', names: string[]): Pem {
  const extensions = path.join(dir, `${name}.ext`);
  writeFileSync(extensions, `subjectAltName=${names.join(',')}\nextendedKeyUsage=${usage}\nbasicConstraints=CA:FALSE\n`);
  openssl('req', ...EC, '-subj', `/CN=${name}`, '-keyout', `${name}.key`, '-out', `${name}.csr`);
  openssl('x509', '-req', '-in', `${name}.csr`, '-CA', issuer.cert, '-CAkey', issuer.key, '-CAcreateserial', '-days', '2',
    '-extfile', extensions, '-out', `${name}.crt`);
  return pem(name);
}
