/**
 * How the client reaches Tollgate: TLS and mTLS (certificates made by openssl for this run), a unix
 * socket, and the channel clients of one process share.
 */
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { Client, Unavailable, type ClientOptions } from '@tollgate/client';

import { ca, leaf, type Pem } from './support/certs.js';
import { PATIENT_DEADLINE_MS, Tollgate, newKey, tempDir } from './support/processes.js';

const CLIENT_SAN = 'app.tollgate.test';

const clients: Client[] = [];
function client(options: Partial<ClientOptions> & { target: string }): Client {
  const made = new Client({ domain: 'test', deadlineMs: PATIENT_DEADLINE_MS, failure: 'closed', logger: null, ...options });
  clients.push(made);
  return made;
}

after(() => {
  for (const made of clients) {
    made.close();
  }
});

/** Whether a check through `made` is answered (false: the TLS handshake failed, Unavailable). */
async function answers(made: Client): Promise<boolean> {
  try {
    return (await made.check([{ phone: newKey() }])).allowed;
  } catch (error) {
    assert.ok(error instanceof Unavailable, String(error));
    return false;
  }
}

describe('TLS', () => {
  let serverCa: Pem;
  let server: Tollgate;
  before(async () => {
    serverCa = ca('server-ca');
    const cert = leaf(serverCa, 'server', 'serverAuth', ['DNS:tollgate.test', 'IP:127.0.0.1']);
    server = await Tollgate.start({
      env: { GRPC_SERVER_USE_TLS: 'true', GRPC_SERVER_TLS_CERT: cert.cert, GRPC_SERVER_TLS_KEY: cert.key },
    });
  });
  after(() => server.stop());

  it('is answered by a client that trusts the server’s CA', async () => {
    assert.equal(await answers(client({ target: server.grpc, tls: { ca: serverCa.certPem } })), true);
    // The name to check, when the address is not the certificate's.
    const named = client({ target: server.grpc, tls: { ca: serverCa.certPem, serverName: 'tollgate.test' } });
    assert.equal(await answers(named), true);
  });

  it('is refused to a client that does not trust it, or speaks plaintext, within the deadline', async () => {
    const strangers = [
      client({ target: server.grpc, tls: {}, deadlineMs: 1000 }), // Node's own roots
      client({ target: server.grpc, tls: { ca: ca('other-ca').certPem }, deadlineMs: 1000 }),
      client({ target: server.grpc, tls: { ca: serverCa.certPem, serverName: 'other.test' }, deadlineMs: 1000 }),
      client({ target: server.grpc, deadlineMs: 1000 }),
    ];

    assert.deepEqual(await Promise.all(strangers.map(answers)), [false, false, false, false]);
  });
});

describe('mTLS', () => {
  let serverCa: Pem;
  let clientCa: Pem;
  let server: Tollgate;
  before(async () => {
    serverCa = ca('mtls-server-ca');
    clientCa = ca('mtls-client-ca');
    const cert = leaf(serverCa, 'mtls-server', 'serverAuth', ['IP:127.0.0.1']);
    server = await Tollgate.start({
      env: {
        GRPC_SERVER_USE_TLS: 'true',
        GRPC_SERVER_TLS_CERT: cert.cert,
        GRPC_SERVER_TLS_KEY: cert.key,
        GRPC_CLIENT_TLS_CACERT: clientCa.cert,
        GRPC_CLIENT_TLS_SAN: CLIENT_SAN,
      },
    });
  });
  after(() => server.stop());

  it('answers the client with the right certificate, and no other', async () => {
    const right = leaf(clientCa, 'right-client', 'clientAuth', [`DNS:${CLIENT_SAN}`]);
    const wrongName = leaf(clientCa, 'wrong-name', 'clientAuth', ['DNS:intruder.test']);
    const wrongCa = leaf(ca('stranger-ca'), 'stranger', 'clientAuth', [`DNS:${CLIENT_SAN}`]);
    const tls = (identity?: Pem) => ({
      ca: serverCa.certPem,
      ...(identity === undefined ? {} : { cert: identity.certPem, key: identity.keyPem }),
    });

    assert.equal(await answers(client({ target: server.grpc, tls: tls(right) })), true);
    const refused = [tls(wrongName), tls(wrongCa), tls()].map((options) =>
      client({ target: server.grpc, tls: options, deadlineMs: 1000 }),
    );
    assert.deepEqual(await Promise.all(refused.map(answers)), [false, false, false]);
  });

  it('refuses half an identity before anything is sent', () => {
    assert.throws(() => new Client({ domain: 'test', tls: { cert: 'a certificate' } }), /tls.cert and tls.key come together/);
  });
});

describe('a unix socket', () => {
  it('carries the calls', async () => {
    const socket = path.join(tempDir('uds'), 'tollgate.sock');
    const server = await Tollgate.start({ env: { GRPC_UDS: socket } });
    try {
      assert.equal(server.grpc, `unix:${socket}`);
      assert.equal(await answers(client({ target: server.grpc })), true);
    } finally {
      await server.stop();
    }
  });
});

describe('the shared channel', () => {
  it('is one per target and settings, and closes with its last client', async () => {
    const server = await Tollgate.start();
    try {
      const first = client({ target: server.grpc });
      const second = client({ target: server.grpc, failure: 'open' }); // another policy, the same channel
      const own = client({ target: server.grpc, sharedChannel: false });
      const tuned = client({ target: server.grpc, channelOptions: { 'grpc.max_receive_message_length': 1 << 20 } });

      assert.equal(first.channel, second.channel);
      assert.notEqual(own.channel, first.channel);
      assert.notEqual(tuned.channel, first.channel);
      assert.deepEqual(await Promise.all([first, second, own, tuned].map(answers)), [true, true, true, true]);

      first.close();
      first.close(); // twice is once
      assert.equal(await answers(second), true); // still open: second uses it
      second.close();
      const third = client({ target: server.grpc });
      assert.notEqual(third.channel, second.channel); // the old one closed with its last client
      assert.equal(await answers(third), true);
    } finally {
      await server.stop();
    }
  });
});
