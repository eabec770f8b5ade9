// An MCP client nobody here wrote: the MCP TypeScript SDK's Client over streamable HTTP with its OAuth support
// (ClientCredentialsProvider: the client credentials grant with client_secret_basic). Given only the server URL and
// a pre-registered client id/secret, it meets the 401, follows resource_metadata to the Protected Resource Metadata
// (RFC 9728), discovers the authorization server (RFC 8414 / OpenID discovery), asks it for a token for the
// resource the metadata names (RFC 8707), and retries: then it calls the upload_content tool.
//
//   node mcp_client.mjs <mcp url> <client id> <client secret> <issuer> <scope>
// prints one JSON line: {"tool": <the tool's result>, "token": <the access token it used>, "requests": [...]}
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ClientCredentialsProvider } from '@modelcontextprotocol/sdk/client/auth-extensions.js';

const [serverUrl, clientId, clientSecret, issuer, scope] = process.argv.slice(2);
const requests = [];
const fetchFn = async (url, init) => {
  const response = await fetch(url, init);
  requests.push(`${init?.method || 'GET'} ${url} ${response.status}`);
  return response;
};
const provider = new ClientCredentialsProvider({ clientId, clientSecret, expectedIssuer: issuer, scope });
const transport = new StreamableHTTPClientTransport(new URL(serverUrl), { authProvider: provider, fetch: fetchFn });
const client = new Client({ name: 'identity-test', version: '1.0.0' });
await client.connect(transport);
const tool = await client.callTool({
  name: 'upload_content',
  arguments: { data: 'uploaded by an MCP client with an OAuth token', name: 'from-mcp.txt' },
});
await client.close();
process.stdout.write(JSON.stringify({ tool, token: provider.tokens()?.access_token, requests }) + '\n');
