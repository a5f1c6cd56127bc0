/**
 * A CommonJS TypeScript consumer of the package: compiled with the tests (never run), so its types
 * resolve through the package's `require` condition as the ESM tests' resolve through `import`.
 */
import { Client, Unavailable, expressRateLimit, type Decision, type Descriptors } from '@tollgate/client';

const client: Client = new Client({ domain: 'api', tls: { serverName: 'tollgate.internal' } });
const descriptors: Descriptors = [{ user: '42' }, new Map([['route', '/export']])];

export const middleware = expressRateLimit({ client, describe: () => descriptors });

export async function allowed(): Promise<boolean> {
  try {
    const decision: Decision = await client.check(descriptors, { cost: 2 });
    return decision.allowed && decision.retryAfterSeconds() > 0;
  } catch (error) {
    return !(error instanceof Unavailable);
  }
}
