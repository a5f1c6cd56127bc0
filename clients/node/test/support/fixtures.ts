/** The servers and clients a suite shares, started before its tests and stopped after them. */
import { after, before } from 'node:test';

import { Client, type ClientOptions } from '@tollgate/client';

import { PATIENT_DEADLINE_MS, Tollgate, type TollgateOptions } from './processes.js';

/**
 * A suite's server, and a client of it in domain `test` with a patient deadline, failing closed: an
 * outage the test did not cause is an error, never a decision that slipped through.
 */
export interface Served {
  readonly server: Tollgate;
  readonly client: Client;
  /** Another client of the same server (closed after the suite). */
  clientWith(options: Partial<ClientOptions>): Client;
}

/**
 * Starts a Tollgate before the enclosing suite's tests and stops it after them. The returned object's
 * fields are set once the suite runs.
 */
export function serve(options: TollgateOptions = {}): Served {
  const clients: Client[] = [];
  const served = {
    server: undefined as unknown as Tollgate,
    client: undefined as unknown as Client,
    clientWith(extra: Partial<ClientOptions>): Client {
      const client = new Client({
        target: served.server.grpc,
        domain: 'test',
        deadlineMs: PATIENT_DEADLINE_MS,
        failure: 'closed',
        ...extra,
      });
      clients.push(client);
      return client;
    },
  };
  before(async () => {
    served.server = await Tollgate.start(options);
    served.client = served.clientWith({});
  });
  after(async () => {
    for (const client of clients) {
      client.close();
    }
    await served.server?.stop();
  });
  return served;
}

/** The value of header `name` (any case); fails the test when it is missing. */
export function header(headers: Readonly<Record<string, string>>, name: string): string {
  const found = Object.entries(headers).find(([key]) => key.toLowerCase() === name.toLowerCase());
  if (found === undefined) {
    throw new Error(`no ${name} header in ${JSON.stringify(headers)}`);
  }
  return found[1];
}
