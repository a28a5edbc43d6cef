/**
 * OAuth for Streamable HTTP servers: the SDK runs discovery, registration, PKCE and the token exchange; the provider
 * here keeps their state for the connection's lifetime (tokens outlive a session) and plays the user's part.
 */

import type { OAuthClientProvider } from "@modelcontextprotocol/sdk/client/auth.js"
import type {
  OAuthClientInformationMixed,
  OAuthClientMetadata,
  OAuthTokens
} from "@modelcontextprotocol/sdk/shared/auth.js"
import { Config, Effect, Redacted } from "effect"
import type { McpOAuthConfig, McpServerConfig } from "../config/EnvironmentConfig.ts"
import { McpConnectError, redactUrl } from "./Errors.ts"

/**
 * A headless OAuth client (the SDK runs discovery, registration, PKCE and token exchange; this keeps the state).
 * "Redirecting the user" means requesting the authorization URL and reading the code from the redirect it answers
 * with: that works for pre-approved clients, which is all an unattended training run can use.
 */
export class HeadlessOAuthProvider implements OAuthClientProvider {
  readonly redirect: string
  readonly metadata: OAuthClientMetadata
  clientMetadataUrl?: string
  readonly preRegistered: OAuthClientInformationMixed | undefined
  info: OAuthClientInformationMixed | undefined
  saved: OAuthTokens | undefined
  verifier: string | undefined
  pendingCode: string | undefined

  constructor(oauth: McpOAuthConfig, clientSecret: string | undefined) {
    this.redirect = oauth.redirect_url
    this.metadata = {
      client_name: oauth.client_name,
      redirect_uris: [oauth.redirect_url],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      ...(oauth.scope === undefined ? {} : { scope: oauth.scope })
    }
    if (oauth.client_metadata_url !== undefined) this.clientMetadataUrl = oauth.client_metadata_url
    this.preRegistered =
      oauth.client_id === undefined
        ? undefined
        : { client_id: oauth.client_id, ...(clientSecret === undefined ? {} : { client_secret: clientSecret }) }
    this.info = this.preRegistered
  }
  get redirectUrl(): string {
    return this.redirect
  }
  get clientMetadata(): OAuthClientMetadata {
    return this.metadata
  }
  clientInformation() {
    return this.info
  }
  saveClientInformation(info: OAuthClientInformationMixed) {
    this.info = info
  }
  tokens() {
    return this.saved
  }
  saveTokens(tokens: OAuthTokens) {
    this.saved = tokens
  }
  saveCodeVerifier(verifier: string) {
    this.verifier = verifier
  }
  codeVerifier(): string {
    if (this.verifier === undefined) throw new Error("no PKCE code verifier saved")
    return this.verifier
  }
  async redirectToAuthorization(url: URL): Promise<void> {
    const response = await fetch(url, { redirect: "manual" })
    const location = response.headers.get("location")
    const code = location === null ? null : new URL(location, url).searchParams.get("code")
    if (code === null) {
      throw new Error(`authorization at ${redactUrl(url.toString())} wants a user (no redirect with a code)`)
    }
    this.pendingCode = code
  }
  invalidateCredentials(scope: "all" | "client" | "tokens" | "verifier" | "discovery") {
    if (scope === "all" || scope === "tokens") this.saved = undefined
    if (scope === "all" || scope === "client") this.info = this.preRegistered
    if (scope === "all" || scope === "verifier") this.verifier = undefined
  }
  /** The code the last authorization redirect carried, once. */
  takeCode(): string | undefined {
    const code = this.pendingCode
    this.pendingCode = undefined
    return code
  }
}

/** The provider an `oauth` config section describes; its client secret is read from the environment it names. */
export const makeOAuthProvider = (config: McpServerConfig, oauth: McpOAuthConfig) =>
  Effect.gen(function* () {
    const secret =
      oauth.client_secret === undefined
        ? undefined
        : Redacted.value(
            yield* Config.Redacted(oauth.client_secret.env).pipe(
              Effect.mapError(
                () =>
                  new McpConnectError({
                    server: config.name,
                    reason: "Unauthorized",
                    message: `MCP server ${config.name}: oauth.client_secret names env ${oauth.client_secret?.env}, which is not set`
                  })
              )
            )
          )
    return new HeadlessOAuthProvider(oauth, secret)
  })
