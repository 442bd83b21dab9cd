// LibreTranslate's npm client against a server: node translate.mjs URL SOURCE TARGET TEXT... prints one JSON line per
// text. SOURCE "-" leaves it out, so the client sends its default, "auto"; $API_KEY is sent as the client sends keys.
import client from "libretranslate";

const [apiurl, source, target, ...texts] = process.argv.slice(2);
for (const query of texts) {
  const text = await client.translate({ query, source: source === "-" ? undefined : source, target, apiurl, apiKey: process.env.API_KEY });
  console.log(JSON.stringify(text));
}
