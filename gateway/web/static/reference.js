// The reference page (/v1/docs): Swagger UI over this server's /v1/openapi.json. "Try it
// out" sends requests from this tab; "Authorize" keeps a credential in this page only.
window.ui = SwaggerUIBundle({
  url: "/v1/openapi.json",
  dom_id: "#reference",
  deepLinking: true,
  tryItOutEnabled: false,
  persistAuthorization: false,
});
