// A real OAuth 2.1 / OpenID authorization server for the identity tests: oidc-provider (a certified OpenID
// Provider) on a loopback port, issuing access tokens by client credentials (RFC 6749 §4.4) for a resource named
// with RFC 8707's resource parameter, as JWTs (RFC 9068) or, for the client "opaque-agent", as opaque tokens to
// introspect (RFC 7662). Its signing keys come from the file named on the command line (the tests rotate them by
// restarting it with another file).
//
//   node issuer.mjs <port> <config.json>
//   config: {"jwks": {"keys": [private JWKs]}, "clients": [{client_id, client_secret, ttl?, format?}],
//            "scope": "upload read admin", "alg": "RS256"}
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const [port, configFile] = process.argv.slice(2);
const config = JSON.parse(readFileSync(configFile, 'utf8'));
const byId = Object.fromEntries(config.clients.map((c) => [c.client_id, c]));

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: config.clients.map((c) => ({
    client_id: c.client_id,
    client_secret: c.client_secret,
    grant_types: c.introspector ? [] : ['client_credentials'],
    redirect_uris: [],
    response_types: [],
    token_endpoint_auth_method: 'client_secret_basic',
    scope: config.scope,
  })),
  jwks: config.jwks,
  scopes: config.scope.split(' '),
  features: {
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    revocation: { enabled: true },
    devInteractions: { enabled: false },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resourceIndicator, client) => {
        const c = byId[client.clientId] || {};
        return {
          scope: c.scope || config.scope,
          audience: resourceIndicator,
          accessTokenTTL: c.ttl || 300,
          accessTokenFormat: c.format || 'jwt',
          jwt: { sign: { alg: config.alg || 'RS256' } },
        };
      },
    },
  },
});
provider.proxy = false;
const server = provider.listen(Number(port), '127.0.0.1', () => {
  process.stdout.write(`listening ${port}\n`);
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
